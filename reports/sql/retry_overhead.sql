-- Retry overhead by model: attempts beyond one per request, tokens the engines processed that
-- nobody paid for (burnt), their list-price value, and the GPU cost of attempts that did not answer.
-- plot: bar x=model y=burnt_share
SELECT
    a.model AS model,
    uniqExact(a.request_id) AS n_requests,
    count() AS n_attempts,
    n_attempts - n_requests AS n_retries,
    sum(a.burnt_tokens) AS burnt_tok,
    sum(a.billed_tokens) AS billed_tok,
    round(if(burnt_tok + billed_tok > 0, burnt_tok / (burnt_tok + billed_tok), 0), 4) AS burnt_share,
    round(sum(a.burnt_list_cost_usd), 6) AS burnt_list_usd,
    round(sumIf(g.g_cost, a.status_class != 'ok'), 6) AS failed_attempts_gpu_usd
FROM attempts AS a
LEFT JOIN
(
    SELECT request_id AS g_request_id, attempt AS g_attempt, sum(gpu_cost_usd) AS g_cost
    FROM gpu_attribution FINAL
    GROUP BY request_id, attempt
) AS g ON a.request_id = g.g_request_id AND a.attempt = g.g_attempt
GROUP BY a.model
ORDER BY a.model
