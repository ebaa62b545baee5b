// One step of the ladder, as `make loadtest` runs it: LOAD_VUS closed-loop clients (one open
// connection each) send the §8.3 mix for LOAD_WARMUP_S seconds (not measured), then hold for
// LOAD_HOLD_S seconds (measured). Every request writes one record, a JSON line on k6's log
// (llmlab_loadtest.ladder runs k6 with --log-format raw into a file): when it started (ms since
// the epoch), its phase, class, status, OpenAI error code, time to first byte, end to end and the
// usage block's tokens, and when it ended (x). The step's figures are computed from those records, so a percentile in
// the report can be recomputed from the raw step file. No threshold here: the ladder's stop
// rule is applied by the runner to the hold phase's records.
import exec from 'k6/execution';
import { between, chat, drawClass, prompt, summaryOutputs, TREND_STATS } from './lib/openai.js';

const vus = Number(__ENV.LOAD_VUS || 1);
const warmupS = Number(__ENV.LOAD_WARMUP_S || 15);
const holdS = Number(__ENV.LOAD_HOLD_S || 60);
// A request still running when the hold ends may finish within this grace, else k6 cuts it
// (status 0: k6's request returns unanswered, and k6 drops its metrics, not its record).
const graceS = Number(__ENV.LOAD_GRACE_S || 60);

export const options = {
  summaryTrendStats: TREND_STATS,
  scenarios: {
    warmup: { executor: 'constant-vus', vus, duration: `${warmupS}s`, gracefulStop: '0s', tags: { phase: 'warmup' } },
    hold: {
      executor: 'constant-vus',
      vus,
      duration: `${holdS}s`,
      startTime: `${warmupS}s`,
      gracefulStop: `${graceS}s`,
      tags: { phase: 'hold' },
    },
  },
};

export default function () {
  const c = drawClass();
  const started = Date.now();
  const r = chat({
    content: prompt(between(c.input[0], c.input[1])),
    maxTokens: between(c.output[0], c.output[1]),
    tags: { class: c.name },
    model: c.model,
  });
  console.log(
    JSON.stringify({
      t: started,
      p: exec.scenario.name,
      c: c.name,
      s: r.status,
      e: r.code,
      f: r.ttfb,
      d: r.e2e,
      pt: r.usage ? r.usage.prompt_tokens || 0 : 0,
      ct: r.usage ? r.usage.completion_tokens || 0 : 0,
      ok: r.ok ? 1 : 0,
      x: Date.now(),
    }),
  );
}

export const handleSummary = summaryOutputs;
