-- Cost per request and per 1M tokens by model and day: list price (billed tokens × the catalog's
-- dated price) and GPU time (attributed, idle included; 0 until the period is attributed).
-- plot: bar x=model y=list_usd_per_request,gpu_usd_per_request
SELECT
    toDate(created_at) AS day,
    model,
    count() AS n_requests,
    sum(billed_tokens) AS billed_tok,
    sum(prompt_tokens + completion_tokens) AS engine_tok,
    round(sum(list_cost_usd), 6) AS list_usd,
    round(sum(gpu_cost_usd), 6) AS gpu_usd,
    round(list_usd / n_requests, 8) AS list_usd_per_request,
    round(gpu_usd / n_requests, 8) AS gpu_usd_per_request,
    round(if(billed_tok > 0, list_usd / billed_tok * 1e6, 0), 4) AS list_usd_per_mtok,
    round(if(engine_tok > 0, gpu_usd / engine_tok * 1e6, 0), 4) AS gpu_usd_per_mtok
FROM requests
WHERE attempts > 0
GROUP BY day, model
ORDER BY day, model
