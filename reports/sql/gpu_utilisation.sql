-- GPU cost and utilisation by day and model, from the attribution periods: every worker-period
-- costs $/hour × hours and all of it is attributed (attributed_usd = cost_usd), idle included.
-- plot: bar x=model y=busy_share
SELECT
    toDate(period_start) AS day,
    model,
    count() AS worker_periods,
    round(sum(period_s) / 3600, 4) AS worker_hours,
    round(sum(busy_s) / sum(period_s), 4) AS busy_share,
    round(sum(period_usd), 6) AS cost_usd,
    round(sum(attributed_usd), 6) AS attributed_usd
FROM gpu_periods FINAL
GROUP BY day, model
ORDER BY day, model
