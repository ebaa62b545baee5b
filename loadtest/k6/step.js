// One step of the ladder, as `make loadtest` runs it: LOAD_VUS closed-loop clients (one open
// connection each) send the §8.3 mix for LOAD_WARMUP_S seconds (not measured), then hold for
// LOAD_HOLD_S seconds (measured). Every request writes one record, a JSON line on k6's log
// (llmlab_loadtest.ladder runs k6 with --log-format raw into a file): when it started (ms since
// the epoch), its phase, class, status, OpenAI error code, time to first byte, end to end, the
// usage block's tokens, when it ended (x) and when the hold began (h). The step's figures are
// computed from those records, so a percentile in the report can be recomputed from the raw
// step file. No threshold here: the runner applies the ladder's stop rule to the hold's records.
import exec from 'k6/execution';
import { between, chat, drawClass, prompt, summaryOutputs, TREND_STATS } from './lib/openai.js';

const vus = Number(__ENV.LOAD_VUS || 1);
const warmupS = Number(__ENV.LOAD_WARMUP_S || 15);
const holdS = Number(__ENV.LOAD_HOLD_S || 60);
// A request still running when the hold ends may finish within this grace, else k6 cuts it
// (status 0: k6's request returns unanswered, and k6 drops its metrics, not its record).
const graceS = Number(__ENV.LOAD_GRACE_S || 60);

// One scenario for warm-up and hold, so the same clients carry on across the boundary (no
// burst of fresh connections when the measurement starts); a request's phase is that of its start.
export const options = {
  summaryTrendStats: TREND_STATS,
  scenarios: {
    step: { executor: 'constant-vus', vus, duration: `${warmupS + holdS}s`, gracefulStop: `${graceS}s` },
  },
};

export default function () {
  const c = drawClass();
  const started = Date.now();
  const elapsed = exec.instance.currentTestRunDuration;
  const holdStart = started - elapsed + warmupS * 1000;
  const r = chat({
    content: prompt(between(c.input[0], c.input[1])),
    maxTokens: between(c.output[0], c.output[1]),
    tags: { class: c.name },
    model: c.model,
  });
  console.log(
    JSON.stringify({
      t: started,
      p: elapsed < warmupS * 1000 ? 'warmup' : 'hold',
      c: c.name,
      s: r.status,
      e: r.code,
      f: r.ttfb,
      d: r.e2e,
      pt: r.usage ? r.usage.prompt_tokens || 0 : 0,
      ct: r.usage ? r.usage.completion_tokens || 0 : 0,
      ok: r.ok ? 1 : 0,
      x: Date.now(),
      h: Math.round(holdStart),
    }),
  );
}

export const handleSummary = summaryOutputs;
