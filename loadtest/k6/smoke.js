// Smoke: one VU, a few short requests; every one must be answered (make k6 SCENARIO=smoke).
import { TREND_STATS, chat, prompt, summaryOutputs } from './lib/openai.js';

export const options = {
  summaryTrendStats: TREND_STATS,
  vus: 1,
  iterations: Number(__ENV.LOAD_ITERATIONS || 5),
  thresholds: {
    llm_ok: ['rate==1'],
    'llm_responses{status:200}': [`count==${Number(__ENV.LOAD_ITERATIONS || 5)}`],
  },
};

export default function () {
  chat({ content: prompt(64), maxTokens: Number(__ENV.LOAD_MAX_TOKENS || 16) });
}

export const handleSummary = summaryOutputs;
