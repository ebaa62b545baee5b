-- Schema of the accounting store: the same statements on chdb (embedded) and on a ClickHouse
-- server (clickhouse client --multiquery < schema.sql). Idempotent.
--
-- Dedup: JetStream delivers at least once, and the service may be killed between an insert and
-- its ack, so the same event can be inserted twice. The raw tables are ReplacingMergeTree keyed
-- by the event's identity; every reader goes through FINAL (the views below), which collapses
-- duplicates whether or not a background merge already did.

CREATE TABLE IF NOT EXISTS attempts_raw
(
    request_id String,
    attempt UInt16,
    source LowCardinality(String),            -- worker | gateway: both may report one attempt
    outcome LowCardinality(String),
    status_class LowCardinality(String),
    created_at DateTime64(3, 'UTC'),          -- when the gateway accepted the request
    started_at Nullable(DateTime64(3, 'UTC')), -- engine call start (worker rows)
    ended_at DateTime64(3, 'UTC'),
    tenant_id String,
    team_id String,
    user_id String,
    key_id String,
    plan LowCardinality(String),
    model LowCardinality(String),
    deployment LowCardinality(String),
    pool LowCardinality(String),
    pipeline LowCardinality(String),
    engine LowCardinality(String),
    gpu LowCardinality(String),
    gpu_count UInt16,
    worker_id Nullable(String),
    endpoint LowCardinality(String),
    finish_reason Nullable(String),
    error_status Nullable(UInt16),
    error_type Nullable(String),
    error_code Nullable(String),
    route_policy Nullable(String),
    route_reason Nullable(String),
    route_position Nullable(UInt16),
    fallback_from Nullable(String),
    slo_class Nullable(String),
    prompt_hash Nullable(String),
    prompt_tokens UInt32,
    cached_tokens Nullable(UInt32),
    completion_tokens UInt32,
    billed_input_tokens Nullable(UInt32),
    billed_output_tokens UInt32,
    is_billing UInt8,
    nats_queue_s Nullable(Float64),
    engine_queue_s Nullable(Float64),
    ttft_s Nullable(Float64),
    prefill_s Nullable(Float64),
    decode_s Nullable(Float64),
    e2e_s Nullable(Float64),
    itl_p50_s Nullable(Float64),
    itl_p95_s Nullable(Float64),
    tpot_s Nullable(Float64),
    auth_s Nullable(Float64),                 -- gateway: authenticate + reserve
    route_s Nullable(Float64),                -- gateway: routing decision
    dispatch_offset_s Nullable(Float64),      -- gateway accepted → this attempt published
    engine_queue_method Nullable(String),     -- engine (reported per request) | window_mean (estimate)
    parse_s Nullable(Float64),                -- gateway: accepted → admission started
    prep_s Nullable(Float64),                 -- gateway: routing decided → the first attempt published
    first_dispatch_offset_s Nullable(Float64),-- gateway: accepted → the first attempt published
    intake_s Nullable(Float64),               -- worker: took it → engine call sent
    finish_s Nullable(Float64),               -- worker: last token → terminal message
    resumed_tokens UInt32 DEFAULT 0,          -- a stream's continuation: tokens delivered before it, billed here
    carried_tokens UInt32 DEFAULT 0,          -- an interrupted attempt: tokens it delivered, billed by a later one
    input_usd_per_mtok Float64,
    output_usd_per_mtok Float64,
    cached_input_usd_per_mtok Nullable(Float64),
    gpu_usd_per_hour Float64,
    price_as_of String,
    slo_ttft_ok Nullable(UInt8),
    slo_tpot_ok Nullable(UInt8),
    slo_e2e_ok Nullable(UInt8),
    slo_ok Nullable(UInt8),
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ended_at)
ORDER BY (request_id, attempt, source);

-- Directories created before the column existed.
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS prompt_hash Nullable(String) AFTER slo_class;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS auth_s Nullable(Float64) AFTER tpot_s;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS route_s Nullable(Float64) AFTER auth_s;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS dispatch_offset_s Nullable(Float64) AFTER route_s;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS engine_queue_method Nullable(String) AFTER dispatch_offset_s;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS parse_s Nullable(Float64) AFTER engine_queue_method;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS prep_s Nullable(Float64) AFTER parse_s;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS first_dispatch_offset_s Nullable(Float64) AFTER prep_s;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS intake_s Nullable(Float64) AFTER first_dispatch_offset_s;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS finish_s Nullable(Float64) AFTER intake_s;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS resumed_tokens UInt32 DEFAULT 0 AFTER finish_s;
ALTER TABLE attempts_raw ADD COLUMN IF NOT EXISTS carried_tokens UInt32 DEFAULT 0 AFTER resumed_tokens;

CREATE TABLE IF NOT EXISTS requests_raw
(
    request_id String,
    status UInt16,
    status_class LowCardinality(String),
    error_type String,
    error_code Nullable(String),
    model Nullable(String),
    deployment Nullable(String),
    tenant_id Nullable(String),
    team_id Nullable(String),
    user_id Nullable(String),
    key_id Nullable(String),
    plan Nullable(String),
    attempts UInt16,
    created_at DateTime64(3, 'UTC'),
    ended_at DateTime64(3, 'UTC'),
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(ended_at)
ORDER BY request_id;

-- GPU-time attribution (llmlab_accounting.attribution): one row per attempt and worker period.
-- A re-run of a period replaces its rows (version computed_at).
CREATE TABLE IF NOT EXISTS gpu_attribution
(
    period_start DateTime64(3, 'UTC'),
    worker_id String,
    request_id String,
    attempt UInt16,
    deployment LowCardinality(String),
    model LowCardinality(String),
    busy_s Float64,
    busy_usd Float64,
    idle_usd Float64,
    standby_usd Float64 DEFAULT 0, -- its share of the deployment's standby workers' cost
    gpu_cost_usd Float64,          -- busy + idle + standby
    computed_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(computed_at)
PARTITION BY toYYYYMM(period_start)
ORDER BY (period_start, worker_id, request_id, attempt);
-- Stores created before standby attribution existed.
ALTER TABLE gpu_attribution ADD COLUMN IF NOT EXISTS standby_usd Float64 DEFAULT 0 AFTER idle_usd;

-- Worker heartbeats (core NATS, one a second or so per worker): who was up, on which deployment
-- and at what GPU price, so that a worker that served nothing in a period still costs something.
CREATE TABLE IF NOT EXISTS worker_heartbeats
(
    worker_id String,
    pool LowCardinality(String),
    engine LowCardinality(String),
    deployment LowCardinality(String), -- '' when the catalog has no deployment for its pool
    model LowCardinality(String),
    gpu_usd_per_hour Float64,          -- the deployment's GPU price × gpu_count
    ready UInt8,
    sent_at DateTime64(3, 'UTC'),
    interval_s Float64,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(ingested_at)
PARTITION BY toYYYYMM(sent_at)
ORDER BY (worker_id, sent_at)
TTL toDateTime(sent_at) + INTERVAL 35 DAY;

-- One row per worker and period: what the GPUs cost and how much of it was attributed. A standby
-- worker (up, no attempt) has attempts = 0 and period_s = the time its heartbeats cover; its
-- attributed_usd is what its deployment's attempts carry, 0 when the deployment served nothing.
CREATE TABLE IF NOT EXISTS gpu_periods
(
    period_start DateTime64(3, 'UTC'),
    period_s Float64,
    worker_id String,
    deployment LowCardinality(String),
    model LowCardinality(String),
    usd_per_hour Float64,
    busy_s Float64,
    period_usd Float64,
    attributed_usd Float64,
    attempts UInt32,
    computed_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(computed_at)
PARTITION BY toYYYYMM(period_start)
ORDER BY (period_start, worker_id);

-- One row per (request_id, attempt). Precedence: the worker's row of an attempt that ran (it has
-- the engine's usage and timings), else the gateway's, else a worker's drop. Billing comes from
-- whichever row the budget charges (the worker's completed event, or the gateway's
-- client-disconnect cancel or its completed event for a stream it ended at its last allowed
-- token), and so does how the attempt ended (outcome, status, finish, error): the worker of such a
-- stream reports the engine's failure, the client got a whole answer. Views are replaced at every
-- start, tables are never altered.
CREATE OR REPLACE VIEW attempts AS
SELECT
    p.request_id AS request_id,
    p.attempt AS attempt,
    p.source AS source,
    b.b_events AS events,
    if(b.b_billing = 1, b.b_end.1, p.outcome) AS outcome,
    if(b.b_billing = 1, b.b_end.2, p.status_class) AS status_class,
    p.created_at AS created_at,
    p.started_at AS started_at,
    p.ended_at AS ended_at,
    p.tenant_id AS tenant_id,
    p.team_id AS team_id,
    p.user_id AS user_id,
    p.key_id AS key_id,
    p.plan AS plan,
    p.model AS model,
    p.deployment AS deployment,
    p.pool AS pool,
    p.pipeline AS pipeline,
    p.engine AS engine,
    p.gpu AS gpu,
    p.gpu_count AS gpu_count,
    p.worker_id AS worker_id,
    p.endpoint AS endpoint,
    if(b.b_billing = 1, b.b_end.3, p.finish_reason) AS finish_reason,
    if(b.b_billing = 1, b.b_end.4, p.error_status) AS error_status,
    if(b.b_billing = 1, b.b_end.5, p.error_type) AS error_type,
    if(b.b_billing = 1, b.b_end.6, p.error_code) AS error_code,
    p.route_policy AS route_policy,
    p.route_reason AS route_reason,
    p.route_position AS route_position,
    p.fallback_from AS fallback_from,
    p.slo_class AS slo_class,
    p.prompt_hash AS prompt_hash,
    b.b_prompt AS prompt_tokens,
    p.cached_tokens AS cached_tokens,
    b.b_completion AS completion_tokens,
    -- A request pays for its highest billing attempt (llmlab_common.rules.charge_for, as the budget
    -- settles): an earlier attempt the gateway gave up whose worker still completed it bills nothing.
    toUInt8(b.b_billing = 1 AND b.attempt = b.b_last_billing) AS is_billing,
    toUInt32(if(is_billing = 1, if(b.b_billed_in < 0, b.b_prompt, b.b_billed_in), 0)) AS billed_input_tokens,
    toUInt32(if(is_billing = 1, b.b_billed_out, 0)) AS billed_output_tokens,
    -- A resumed stream's continuation bills the original input and every delivered token: the
    -- delivered text it processed again as prompt is burnt; the tokens an interrupted attempt
    -- delivered (carried) are billed by its continuation, not burnt.
    toUInt32(greatest(toInt64(b.b_prompt) - toInt64(billed_input_tokens), 0)) AS burnt_input_tokens,
    toUInt32(greatest(toInt64(b.b_completion) + toInt64(b.b_resumed) - toInt64(billed_output_tokens)
        - toInt64(b.b_carried), 0)) AS burnt_output_tokens,
    billed_input_tokens + billed_output_tokens AS billed_tokens,
    burnt_input_tokens + burnt_output_tokens AS burnt_tokens,
    p.nats_queue_s AS nats_queue_s,
    p.engine_queue_s AS engine_queue_s,
    p.ttft_s AS ttft_s,
    p.prefill_s AS prefill_s,
    p.decode_s AS decode_s,
    p.e2e_s AS e2e_s,
    p.itl_p50_s AS itl_p50_s,
    p.itl_p95_s AS itl_p95_s,
    p.tpot_s AS tpot_s,
    p.auth_s AS auth_s,
    p.route_s AS route_s,
    p.dispatch_offset_s AS dispatch_offset_s,
    p.engine_queue_method AS engine_queue_method,
    p.parse_s AS parse_s,
    p.prep_s AS prep_s,
    p.first_dispatch_offset_s AS first_dispatch_offset_s,
    p.intake_s AS intake_s,
    p.finish_s AS finish_s,
    p.input_usd_per_mtok AS input_usd_per_mtok,
    p.output_usd_per_mtok AS output_usd_per_mtok,
    p.cached_input_usd_per_mtok AS cached_input_usd_per_mtok,
    p.gpu_usd_per_hour AS gpu_usd_per_hour,
    p.price_as_of AS price_as_of,
    (billed_input_tokens * p.input_usd_per_mtok + billed_output_tokens * p.output_usd_per_mtok) / 1e6 AS list_cost_usd,
    (burnt_input_tokens * p.input_usd_per_mtok + burnt_output_tokens * p.output_usd_per_mtok) / 1e6 AS burnt_list_cost_usd,
    p.slo_ttft_ok AS slo_ttft_ok,
    p.slo_tpot_ok AS slo_tpot_ok,
    p.slo_e2e_ok AS slo_e2e_ok,
    p.slo_ok AS slo_ok
FROM
(
    SELECT *
    FROM attempts_raw FINAL
    -- 1: the worker's row of an attempt that ran on the engine; 2: the gateway's; 3: a worker's
    -- row of an attempt it dropped without running (stale redelivery, expired, cancelled early)
    ORDER BY request_id, attempt, multiIf(source = 'worker' AND started_at IS NOT NULL, 1, source = 'gateway', 2, 3)
    LIMIT 1 BY request_id, attempt
) AS p
INNER JOIN
(
    SELECT
        request_id,
        attempt,
        count() AS b_events,
        max(is_billing) AS b_billing,
        -- -1: the billing event did not carry the input tokens (the budget charged its estimate)
        argMax(ifNull(toInt64(billed_input_tokens), -1), (is_billing, source = 'worker')) AS b_billed_in,
        argMax(billed_output_tokens, (is_billing, source = 'worker')) AS b_billed_out,
        -- how the billing row says the attempt ended (a tuple: argMax would skip a NULL error)
        argMax((outcome, status_class, finish_reason, error_status, error_type, error_code),
            (is_billing, source = 'worker')) AS b_end,
        -- engine token counts: the worker's (the gateway's rows carry delivered tokens only)
        toUInt32(if(countIf(source = 'worker') > 0, maxIf(prompt_tokens, source = 'worker'), max(prompt_tokens))) AS b_prompt,
        toUInt32(if(countIf(source = 'worker') > 0, maxIf(completion_tokens, source = 'worker'), max(completion_tokens))) AS b_completion,
        max(resumed_tokens) AS b_resumed,
        max(carried_tokens) AS b_carried,
        max(if(b_billing = 1, attempt, 0)) OVER (PARTITION BY request_id) AS b_last_billing
    FROM attempts_raw FINAL
    GROUP BY request_id, attempt
) AS b ON p.request_id = b.request_id AND p.attempt = b.attempt;

-- One row per request: its attempts joined (final status, billed vs burnt tokens, fallback chain,
-- list-price and GPU-time cost), plus requests refused before any attempt (requests_raw).
CREATE OR REPLACE VIEW requests AS
SELECT
    r.j_request_id AS request_id,
    r.a_attempts AS attempts,
    if(r.f_status > 0, r.f_status_class, r.a_status_class) AS status_class,
    if(r.f_status > 0, r.f_status, multiIf(r.a_status_class = 'ok', 200, r.a_status_class = 'cancelled', 499, 0)) AS http_status,
    if(r.f_status > 0, r.f_error_code, r.a_error_code) AS error_code,
    r.a_outcome AS final_outcome,
    if(r.a_attempts > 0, r.a_created_at, r.f_created_at) AS created_at,
    if(r.a_attempts > 0, r.a_ended_at, r.f_ended_at) AS ended_at,
    if(r.a_attempts > 0, r.a_tenant_id, ifNull(r.f_tenant_id, '')) AS tenant_id,
    if(r.a_attempts > 0, r.a_team_id, ifNull(r.f_team_id, '')) AS team_id,
    if(r.a_attempts > 0, r.a_user_id, ifNull(r.f_user_id, '')) AS user_id,
    if(r.a_attempts > 0, r.a_key_id, ifNull(r.f_key_id, '')) AS key_id,
    if(r.a_attempts > 0, r.a_model, ifNull(r.f_model, '')) AS model,
    r.a_deployment AS deployment,
    r.a_chain AS fallback_chain,
    r.a_prompt AS prompt_tokens,
    r.a_cached AS cached_tokens,
    r.a_completion AS completion_tokens,
    r.a_billed_in AS billed_input_tokens,
    r.a_billed_out AS billed_output_tokens,
    r.a_billed_in + r.a_billed_out AS billed_tokens,
    r.a_burnt AS burnt_tokens,
    r.a_list AS list_cost_usd,
    r.a_burnt_list AS burnt_list_cost_usd,
    g.g_cost AS gpu_cost_usd,
    r.a_slo_ok AS slo_ok,
    r.a_ttft AS ttft_s,
    r.a_tpot AS tpot_s,
    r.a_e2e AS e2e_s
FROM
(
    SELECT
        if(a.a_attempts > 0, a.request_id, f.request_id) AS j_request_id,
        a.*,
        f.status AS f_status,
        f.status_class AS f_status_class,
        f.error_code AS f_error_code,
        f.created_at AS f_created_at,
        f.ended_at AS f_ended_at,
        f.tenant_id AS f_tenant_id,
        f.team_id AS f_team_id,
        f.user_id AS f_user_id,
        f.key_id AS f_key_id,
        f.model AS f_model
    FROM
    (
        SELECT
            request_id,
            count() AS a_attempts,
            argMax(status_class, attempt) AS a_status_class,
            -- tuple(): argMax skips NULL values; wrapped, a NULL of the last attempt is kept
            argMax(tuple(error_code), attempt).1 AS a_error_code,
            argMax(outcome, attempt) AS a_outcome,
            min(created_at) AS a_created_at,
            max(ended_at) AS a_ended_at,
            any(tenant_id) AS a_tenant_id,
            any(team_id) AS a_team_id,
            any(user_id) AS a_user_id,
            any(key_id) AS a_key_id,
            argMax(model, attempt) AS a_model,
            argMax(deployment, attempt) AS a_deployment,
            arrayStringConcat(arrayMap(x -> x.2, arraySort(groupArray((attempt, deployment)))), '>') AS a_chain,
            sum(prompt_tokens) AS a_prompt,
            sum(ifNull(cached_tokens, 0)) AS a_cached,
            sum(completion_tokens) AS a_completion,
            sum(billed_input_tokens) AS a_billed_in,
            sum(billed_output_tokens) AS a_billed_out,
            sum(burnt_tokens) AS a_burnt,
            sum(list_cost_usd) AS a_list,
            sum(burnt_list_cost_usd) AS a_burnt_list,
            argMax(tuple(slo_ok), attempt).1 AS a_slo_ok,
            argMax(tuple(ifNull(nats_queue_s, 0) + ttft_s), attempt).1 AS a_ttft,
            argMax(tuple(tpot_s), attempt).1 AS a_tpot,
            toFloat64(max(ended_at) - min(created_at)) AS a_e2e
        FROM attempts
        GROUP BY request_id
    ) AS a
    FULL OUTER JOIN (SELECT * FROM requests_raw FINAL) AS f ON a.request_id = f.request_id
) AS r
LEFT JOIN
(
    SELECT request_id AS g_request_id, sum(gpu_cost_usd) AS g_cost FROM gpu_attribution FINAL GROUP BY request_id
) AS g ON r.j_request_id = g.g_request_id;
