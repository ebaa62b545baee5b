// OpenAI-compatible chat completions for k6, against any URL (our gateway, vLLM, LiteLLM...).
//
// Configuration, all from the environment (LOAD_*, not K6_*: k6 reads K6_VUS, K6_ITERATIONS,
// K6_DURATION... as its own options, overriding a scenario's executor):
//   LOAD_BASE_URL   the server (default http://127.0.0.1:8080); requests go to /v1/chat/completions
//   LOAD_API_KEY    one bearer key, or LOAD_API_KEYS: a comma-separated list, spread over the VUs
//   LOAD_MODEL      the model name (default meta-llama/Llama-3.1-8B-Instruct)
//   LOAD_CLASS_MODELS  another model for some classes of the mix, e.g.
//                   long_document=Qwen/Qwen3-32B (a long document to the long-context deployment)
//   LOAD_STREAM     "true" (default) or "false"
//   LOAD_TIMEOUT    per request (default 600s)
//   LOAD_TTFT_SLO_MS, LOAD_TPOT_SLO_MS  the interactive SLO (catalog: 1000 ms, 100 ms)
//
// What each figure means. k6 has no SSE parser: a streamed body is read whole, so no per-chunk
// timing exists here (the Python SSE client in llmlab_loadtest.sse_client records every chunk).
//   llm_ttfb   time to the response's first byte. Our gateway sends its headers with the first
//              token, so with streaming on this is the time to first token. A server that sends
//              its headers before generating makes it near 0: compare like with like.
//   llm_e2e    from sending to the last byte.
//   llm_tpot   (e2e - ttfb) / (completion tokens - 1) of one request: its mean time per output
//              token, not the inter-token latency distribution.
//   llm_completion_tokens, llm_prompt_tokens  the usage block (streamed: the final chunk, asked
//              for with stream_options.include_usage), so the engine's own count.
//   llm_responses{status, code}  every answer, by HTTP status and OpenAI error code (bounded:
//              a code that is not a short snake_case word counts as "other").
//   llm_ok     answered 200 with [DONE] (streamed) or a choice (unary).
//   llm_within_slo  answered and within the TTFT and TPOT SLO: goodput's share.
import http from 'k6/http';
import { Counter, Rate, Trend } from 'k6/metrics';

export const cfg = {
  baseUrl: (__ENV.LOAD_BASE_URL || 'http://127.0.0.1:8080').replace(/\/+$/, ''),
  apiKeys: (__ENV.LOAD_API_KEYS || __ENV.LOAD_API_KEY || 'sk-llmlab-dev')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0),
  model: __ENV.LOAD_MODEL || 'meta-llama/Llama-3.1-8B-Instruct',
  classModels: Object.fromEntries(
    (__ENV.LOAD_CLASS_MODELS || '')
      .split(',')
      .filter((s) => s.indexOf('=') > 0)
      .map((s) => [s.slice(0, s.indexOf('=')).trim(), s.slice(s.indexOf('=') + 1).trim()]),
  ),
  stream: (__ENV.LOAD_STREAM || 'true') === 'true',
  timeout: __ENV.LOAD_TIMEOUT || '600s',
  ttftSloMs: Number(__ENV.LOAD_TTFT_SLO_MS || 1000),
  tpotSloMs: Number(__ENV.LOAD_TPOT_SLO_MS || 100),
};

// Percentiles every scenario's summary keeps (k6's default stops at p(95)).
export const TREND_STATS = ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)', 'count'];

export const ttfb = new Trend('llm_ttfb', true);
export const e2e = new Trend('llm_e2e', true);
export const tpot = new Trend('llm_tpot', true);
export const completionTokens = new Counter('llm_completion_tokens');
export const promptTokens = new Counter('llm_prompt_tokens');
export const responses = new Counter('llm_responses');
export const ok = new Rate('llm_ok');
export const withinSlo = new Rate('llm_within_slo');

// The §8.3 request mix (tokens): class, share, prompt range, max_tokens range.
export const MIX = [
  { name: 'short', weight: 0.5, input: [64, 256], output: [32, 128] },
  { name: 'chat', weight: 0.3, input: [256, 1024], output: [128, 512] },
  { name: 'long_document', weight: 0.15, input: [4096, 16384], output: [128, 512] },
  { name: 'long_generation', weight: 0.05, input: [256, 1024], output: [1024, 4096] },
];

const WORDS = ('the quick brown fox jumps over a lazy dog while seven wizards quietly judge ' +
  'boxing matches near the old river bank and every morning bright kites drift above green hills')
  .split(' ');

// About `tokens` tokens of English: 4 bytes per token, the catalog models' BPE average (the
// engine's own count comes back in the usage block).
export function prompt(tokens) {
  const want = Math.max(1, tokens) * 4;
  const parts = [];
  let size = 0;
  for (let i = 0; size < want; i++) {
    const w = WORDS[(i * 7 + tokens) % WORDS.length];
    parts.push(w);
    size += w.length + 1;
  }
  return parts.join(' ');
}

export function between(lo, hi) {
  return lo + Math.floor(Math.random() * (hi - lo + 1));
}

// A class of MIX drawn by its weight (only the classes named in LOAD_MIX_CLASSES when set: real
// vLLM on this CPU fits the short and chat classes only).
export function drawClass() {
  const only = (__ENV.LOAD_MIX_CLASSES || '').split(',').filter((s) => s.length > 0);
  const classes = (only.length ? MIX.filter((c) => only.indexOf(c.name) >= 0) : MIX).map((c) =>
    Object.assign({ model: cfg.classModels[c.name] || cfg.model }, c),
  );
  const total = classes.reduce((a, c) => a + c.weight, 0);
  let r = Math.random() * total;
  for (const c of classes) {
    r -= c.weight;
    if (r <= 0) return c;
  }
  return classes[classes.length - 1];
}

export function keyFor(vu) {
  return cfg.apiKeys[(vu - 1) % cfg.apiKeys.length];
}

function codeOf(body) {
  try {
    const code = JSON.parse(body).error.code;
    return typeof code === 'string' && /^[a-z_]{1,48}$/.test(code) ? code : 'other';
  } catch (e) {
    return 'none';
  }
}

const IN_BAND_ERROR = /data:\s*\{\s*"error"/;

// The JSON of the SSE event whose `data:` line holds `index`.
function eventAt(body, index) {
  const start = body.lastIndexOf('data:', index) + 5;
  const end = body.indexOf('\n', index);
  return body.slice(start, end < 0 ? body.length : end).trim();
}

function usageOf(body, stream) {
  if (!stream) {
    const j = JSON.parse(body);
    return { usage: j.usage || null, done: Array.isArray(j.choices) && j.choices.length > 0 };
  }
  // Only the events that matter are parsed (the client's CPU per request stays small at the
  // ladder's upper steps): [DONE] ends the stream, and the usage block rides on the last chunk
  // before it, so the body is searched from its end. An error after the headers comes in-band
  // (an event {"error": ...}, then [DONE]): not answered, counted by its code.
  const failed = IN_BAND_ERROR.exec(body);
  if (failed) return { usage: null, done: false, code: codeOf(eventAt(body, failed.index + 5)) };
  const done = body.indexOf('data: [DONE]') >= 0;
  let usage = null;
  const at = body.lastIndexOf('"usage"');
  if (at >= 0) {
    try {
      usage = JSON.parse(eventAt(body, at)).usage || null;
    } catch (e) {
      usage = null; // a partial event: not counted
    }
  }
  return { usage, done };
}

// One chat completion; records every metric above and returns {status, code, usage, ok, ttfb, e2e}
// (ttfb and e2e in ms, null unless answered).
export function chat({ content, maxTokens, key, model, tags = {}, headers = {} }) {
  const body = {
    model: model || cfg.model,
    messages: [{ role: 'user', content }],
    max_tokens: maxTokens,
    stream: cfg.stream,
  };
  if (cfg.stream) body.stream_options = { include_usage: true };
  const res = http.post(`${cfg.baseUrl}/v1/chat/completions`, JSON.stringify(body), {
    headers: Object.assign(
      { 'Content-Type': 'application/json', Authorization: `Bearer ${key || keyFor(__VU)}` },
      headers,
    ),
    timeout: cfg.timeout,
    tags: Object.assign({ name: 'chat' }, tags),
    responseType: 'text',
  });
  const status = String(res.status);
  let code = res.status === 200 ? 'ok' : codeOf(res.body);
  let usage = null;
  let answered = false;
  if (res.status === 200) {
    try {
      const u = usageOf(res.body, cfg.stream);
      usage = u.usage;
      answered = u.done;
      if (u.code) code = u.code; // the in-band error's code, under status 200
    } catch (e) {
      answered = false;
    }
  }
  responses.add(1, Object.assign({ status, code }, tags));
  ok.add(answered, tags);
  const out = { status: res.status, code, usage, ok: answered, ttfb: null, e2e: null };
  if (answered) {
    out.ttfb = res.timings.waiting;
    out.e2e = res.timings.duration;
    const first = res.timings.waiting;
    const total = res.timings.duration;
    ttfb.add(first, tags);
    e2e.add(total, tags);
    let perToken = null;
    if (usage) {
      completionTokens.add(usage.completion_tokens || 0, tags);
      promptTokens.add(usage.prompt_tokens || 0, tags);
      if (usage.completion_tokens > 1) {
        perToken = (total - first) / (usage.completion_tokens - 1);
        tpot.add(perToken, tags);
      }
    }
    withinSlo.add(first <= cfg.ttftSloMs && (perToken === null || perToken <= cfg.tpotSloMs), tags);
  } else {
    withinSlo.add(false, tags);
  }
  return out;
}

// What every scenario writes at the end: k6's summary as JSON (LOAD_SUMMARY_JSON, read by
// llmlab_loadtest.k6) and the usual text on stdout.
export function summaryOutputs(data) {
  const out = { stdout: textSummary(data) };
  if (__ENV.LOAD_SUMMARY_JSON) out[__ENV.LOAD_SUMMARY_JSON] = JSON.stringify(data, null, 2);
  return out;
}

function textSummary(data) {
  const m = data.metrics;
  const v = (name, key) => (m[name] && m[name].values[key] !== undefined ? m[name].values[key] : NaN);
  const lines = [
    `requests ${v('llm_responses', 'count')}, answered ${(100 * v('llm_ok', 'rate')).toFixed(1)}%, ` +
      `within SLO ${(100 * v('llm_within_slo', 'rate')).toFixed(1)}%`,
    `ttfb p50 ${v('llm_ttfb', 'med').toFixed(1)} ms, p95 ${v('llm_ttfb', 'p(95)').toFixed(1)} ms; ` +
      `e2e p50 ${v('llm_e2e', 'med').toFixed(1)} ms, p95 ${v('llm_e2e', 'p(95)').toFixed(1)} ms`,
    `completion tokens ${v('llm_completion_tokens', 'count')}, prompt tokens ${v('llm_prompt_tokens', 'count')}`,
  ];
  const failed = Object.entries(m)
    .filter(([, x]) => x.thresholds)
    .flatMap(([name, x]) => Object.entries(x.thresholds).filter(([, t]) => !t.ok).map(([t]) => `${name}: ${t}`));
  lines.push(failed.length ? `thresholds crossed: ${failed.join('; ')}` : 'thresholds: all held');
  return lines.join('\n') + '\n';
}
