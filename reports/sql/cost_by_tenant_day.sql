-- Cost per request and per 1M billed tokens by tenant and day.
SELECT
    toDate(created_at) AS day,
    tenant_id,
    count() AS n_requests,
    sum(billed_tokens) AS billed_tok,
    round(sum(list_cost_usd), 6) AS list_usd,
    round(sum(gpu_cost_usd), 6) AS gpu_usd,
    round(list_usd / n_requests, 8) AS list_usd_per_request,
    round(if(billed_tok > 0, list_usd / billed_tok * 1e6, 0), 4) AS list_usd_per_mtok,
    round(if(billed_tok > 0, gpu_usd / billed_tok * 1e6, 0), 4) AS gpu_usd_per_billed_mtok
FROM requests
GROUP BY day, tenant_id
ORDER BY day, list_usd DESC
