-- Error rates by class and day: ok, refused_budget, shed_budget, shed_admission, auth, client_error, timeout, server_error,
-- cancelled (requests; a retried request that succeeded is ok).
-- plot: bar x=status_class y=n_requests
SELECT
    toDate(created_at) AS day,
    status_class,
    count() AS n_requests,
    round(n_requests / sum(n_requests) OVER (PARTITION BY day), 4) AS share
FROM requests
GROUP BY day, status_class
ORDER BY day, n_requests DESC
