// Budgets and quotas: many tenants' keys (LOAD_API_KEYS, spread over the VUs), some of them over
// budget. A key past its quota or rate must get 429 with its reason (insufficient_quota,
// rate_limit_exceeded, tokens_per_minute_exceeded, concurrency_limit_exceeded), never a 5xx;
// the others must be served. LOAD_OVER_BUDGET_KEYS names the keys expected to be refused: their
// requests are tagged tenant=over, the rest tenant=within.
import { TREND_STATS, cfg, chat, keyFor, prompt, summaryOutputs } from './lib/openai.js';

const over = (__ENV.LOAD_OVER_BUDGET_KEYS || '').split(',').filter((s) => s.length > 0);

export const options = {
  summaryTrendStats: TREND_STATS,
  // One VU per key, each sending LOAD_ITERATIONS (4) requests: every tenant is heard equally.
  scenarios: {
    tenants: { executor: 'per-vu-iterations', vus: cfg.apiKeys.length, iterations: Number(__ENV.LOAD_ITERATIONS || 4) },
  },
  thresholds: {
    'llm_ok{tenant:within}': ['rate==1'],
    'llm_ok{tenant:over}': ['rate==0'],
    'llm_responses{tenant:over,status:429}': ['count>0'],
    'llm_responses{status:500}': ['count==0'],
    'llm_responses{status:503}': ['count==0'],
  },
};

export default function () {
  const key = keyFor(__VU);
  const tenant = over.indexOf(key) >= 0 ? 'over' : 'within';
  chat({ content: prompt(64), maxTokens: Number(__ENV.LOAD_MAX_TOKENS || 16), key, tags: { tenant } });
}

export const handleSummary = summaryOutputs;
