// Steady soak: LOAD_VUS (32) VUs for LOAD_DURATION (10m) with the §8.3 mix; errors and the SLO must
// hold for the whole time (a slow leak shows as a late rise in ttfb or errors).
import { TREND_STATS, between, cfg, chat, drawClass, prompt, summaryOutputs } from './lib/openai.js';

export const options = {
  summaryTrendStats: TREND_STATS,
  vus: Number(__ENV.LOAD_VUS || 32),
  duration: __ENV.LOAD_DURATION || '10m',
  thresholds: {
    llm_ok: ['rate>=0.99'],
    llm_ttfb: [`p(95)<${cfg.ttftSloMs}`],
    'llm_responses{status:500}': ['count==0'],
  },
};

export default function () {
  const c = drawClass();
  chat({ content: prompt(between(c.input[0], c.input[1])), maxTokens: between(c.output[0], c.output[1]), tags: { class: c.name }, model: c.model });
}

export const handleSummary = summaryOutputs;
