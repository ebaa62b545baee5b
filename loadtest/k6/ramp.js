// The ladder: VUs step through LOAD_STEPS (default 1,8,32,64,128,256,512,1000,1500), each held
// LOAD_STEP_S seconds (default 60) after a LOAD_RAMP_S ramp (default 10), with the §8.3 mix. Each
// request is tagged with its step. The run stops when the error rate passes LOAD_MAX_ERROR_RATE
// (default 5%) or the interactive TTFT p95 breaks its SLO, as the ladder's stop rule says
// (evaluated after the first step). Closed loop: each VU sends its next request when the
// previous one ends, so offered load is what the server lets through (make loadtest runs
// the ladder step by step with its own client).
import exec from 'k6/execution';
import { TREND_STATS, between, cfg, chat, drawClass, prompt, summaryOutputs } from './lib/openai.js';

const steps = (__ENV.LOAD_STEPS || '1,8,32,64,128,256,512,1000,1500').split(',').map(Number);
const holdS = Number(__ENV.LOAD_STEP_S || 60);
const rampS = Number(__ENV.LOAD_RAMP_S || 10);
const stages = [];
for (const vus of steps) {
  stages.push({ duration: `${rampS}s`, target: vus });
  stages.push({ duration: `${holdS}s`, target: vus });
}
const delay = `${rampS + holdS}s`;

export const options = {
  summaryTrendStats: TREND_STATS,
  scenarios: { ladder: { executor: 'ramping-vus', startVUs: 0, stages, gracefulRampDown: '30s' } },
  thresholds: {
    llm_ok: [{ threshold: `rate>=${1 - Number(__ENV.LOAD_MAX_ERROR_RATE || 0.05)}`, abortOnFail: true, delayAbortEval: delay }],
    llm_ttfb: [{ threshold: `p(95)<${cfg.ttftSloMs}`, abortOnFail: true, delayAbortEval: delay }],
  },
};

function currentStep() {
  const elapsed = exec.instance.currentTestRunDuration / 1000;
  const i = Math.min(steps.length - 1, Math.floor(elapsed / (rampS + holdS)));
  const inRamp = elapsed - i * (rampS + holdS) < rampS;
  return { step: String(steps[i]), phase: inRamp ? 'ramp' : 'hold' };
}

export default function () {
  const c = drawClass();
  chat({
    content: prompt(between(c.input[0], c.input[1])),
    maxTokens: between(c.output[0], c.output[1]),
    tags: Object.assign({ class: c.name }, currentStep()),
    model: c.model,
  });
}

export const handleSummary = summaryOutputs;
