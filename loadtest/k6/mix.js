// The §8.3 mix at a constant arrival rate: LOAD_RATE requests/s (default 2) for LOAD_DURATION (2m),
// up to LOAD_MAX_VUS (1000) in flight. Open loop: requests arrive whether or not earlier ones
// finished, so offered load is fixed and a slow server shows as a growing backlog and as
// dropped_iterations (what k6 could not start for lack of VUs). Tagged by class.
import { TREND_STATS, between, cfg, chat, drawClass, prompt, summaryOutputs } from './lib/openai.js';

export const options = {
  summaryTrendStats: TREND_STATS,
  scenarios: {
    mix: {
      executor: 'constant-arrival-rate',
      rate: Number(__ENV.LOAD_RATE || 2),
      timeUnit: '1s',
      duration: __ENV.LOAD_DURATION || '2m',
      preAllocatedVUs: Number(__ENV.LOAD_PREALLOCATED_VUS || 50),
      maxVUs: Number(__ENV.LOAD_MAX_VUS || 1000),
    },
  },
  // The short and chat classes must be answered. A long document (4K-16K tokens) may exceed the
  // model's context (the catalog's Llama deployment holds 8,192): that 400
  // context_length_exceeded is the stack's correct answer, counted by code, and 5xx never is.
  thresholds: {
    'llm_ok{class:short}': ['rate>=0.99'],
    'llm_ok{class:chat}': ['rate>=0.99'],
    'llm_responses{status:500}': ['count==0'],
    'llm_responses{status:400}': ['count>=0'],
    'llm_ttfb{class:short}': [`p(95)<${cfg.ttftSloMs}`],
    'llm_ttfb{class:chat}': [`p(95)<${cfg.ttftSloMs}`],
  },
};

export default function () {
  const c = drawClass();
  chat({ content: prompt(between(c.input[0], c.input[1])), maxTokens: between(c.output[0], c.output[1]), tags: { class: c.name }, model: c.model });
}

export const handleSummary = summaryOutputs;
