-- GPU cost and utilisation by day and model, from the attribution periods. Every worker-period
-- costs $/hour × hours (a standby worker, up without an attempt: the hours its heartbeats cover).
-- All of it is attributed to requests, idle and standby time included, except standby time of a
-- deployment that served nothing in that period (unattributed_usd: capacity nobody used).
-- plot: bar x=model y=busy_share
SELECT
    toDate(period_start) AS day,
    model,
    count() AS worker_periods,
    countIf(attempts = 0) AS standby_periods,
    round(sum(period_s) / 3600, 4) AS worker_hours,
    round(sum(busy_s) / sum(period_s), 4) AS busy_share,
    round(sum(period_usd), 6) AS cost_usd,
    round(sum(attributed_usd), 6) AS attributed_usd,
    round(cost_usd - attributed_usd, 6) AS unattributed_usd
FROM gpu_periods FINAL
GROUP BY day, model
ORDER BY day, model
