-- Top 20 spenders (tenant, team, user, key ids; never keys) by list-price cost.
SELECT
    tenant_id,
    team_id,
    user_id,
    key_id,
    count() AS n_requests,
    sum(billed_tokens) AS billed_tok,
    round(sum(list_cost_usd), 6) AS list_usd,
    round(sum(gpu_cost_usd), 6) AS gpu_usd
FROM requests
GROUP BY tenant_id, team_id, user_id, key_id
ORDER BY list_usd DESC
LIMIT 20
