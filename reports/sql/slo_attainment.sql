-- SLO attainment by model: the share of requests that met every SLO (a failed or refused request
-- did not), and latency quantiles of the answered ones. TTFT here = NATS queue + engine TTFT.
-- plot: bar x=model y=attainment
SELECT
    model,
    count() AS n_requests,
    round(avg(ifNull(slo_ok, 0)), 4) AS attainment,
    round(quantileIf(0.5)(ttft_s, status_class = 'ok'), 4) AS ttft_p50_s,
    round(quantileIf(0.95)(ttft_s, status_class = 'ok'), 4) AS ttft_p95_s,
    round(quantileIf(0.5)(tpot_s, status_class = 'ok'), 4) AS tpot_p50_s,
    round(quantileIf(0.95)(tpot_s, status_class = 'ok'), 4) AS tpot_p95_s,
    round(quantileIf(0.95)(e2e_s, status_class = 'ok'), 4) AS e2e_p95_s
FROM requests
WHERE model != ''
GROUP BY model
ORDER BY model
