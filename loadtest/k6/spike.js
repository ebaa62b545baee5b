// Spike: 0 -> LOAD_SPIKE_VUS (1000) in LOAD_SPIKE_RISE (10s), held LOAD_SPIKE_HOLD (60s), back to 0.
// What must hold is no 5xx: a stack past its capacity answers 429 with Retry-After (queue
// timeout, rate limits) and recovers; refusals are counted by code, not failed on.
import { TREND_STATS, chat, prompt, summaryOutputs } from './lib/openai.js';

export const options = {
  summaryTrendStats: TREND_STATS,
  scenarios: {
    spike: {
      executor: 'ramping-vus',
      startVUs: 0,
      stages: [
        { duration: __ENV.LOAD_SPIKE_RISE || '10s', target: Number(__ENV.LOAD_SPIKE_VUS || 1000) },
        { duration: __ENV.LOAD_SPIKE_HOLD || '60s', target: Number(__ENV.LOAD_SPIKE_VUS || 1000) },
        { duration: '10s', target: 0 },
      ],
      gracefulRampDown: '30s',
    },
  },
  thresholds: {
    'llm_responses{status:500}': ['count==0'],
    'llm_responses{status:502}': ['count==0'],
    'llm_responses{status:503}': ['count==0'],
    'llm_responses{status:200}': ['count>0'],
  },
};

export default function () {
  chat({ content: prompt(128), maxTokens: Number(__ENV.LOAD_MAX_TOKENS || 64) });
}

export const handleSummary = summaryOutputs;
