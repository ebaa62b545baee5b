-- Goodput: requests per second that met every SLO of their class (TTFT, TPOT, E2E), by minute,
-- beside throughput (all requests, refused ones included).
-- plot: line x=minute y=throughput_rps,goodput_rps
SELECT
    toStartOfMinute(created_at) AS minute,
    count() AS n_requests,
    countIf(slo_ok = 1) AS n_good,
    round(n_requests / 60, 4) AS throughput_rps,
    round(n_good / 60, 4) AS goodput_rps
FROM requests
GROUP BY minute
ORDER BY minute
