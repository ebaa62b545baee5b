-- Prefix-cache hit rate (cached / prompt tokens, from the engine's usage) beside the share of
-- identical prompts (requests whose whole prompt, by the gateway's prompt hash, was seen before in
-- the period), and the savings at list price (cached tokens × (input price − cached-input price; the
-- whole input price where the catalog has no cached price)). Attempts whose engine reported no
-- cached figure, or that carry no prompt hash, are counted apart.
-- plot: bar x=model y=cache_hit_rate,identical_prompt_share
SELECT
    model,
    count() AS n_attempts,
    countIf(cached_tokens IS NULL) AS n_without_cache_figure,
    sum(prompt_tokens) AS prompt_tok,
    sum(ifNull(cached_tokens, 0)) AS cached_tok,
    round(if(prompt_tok > 0, cached_tok / prompt_tok, 0), 4) AS cache_hit_rate,
    countIf(prompt_hash IS NOT NULL) AS n_hashed,
    round(if(n_hashed > 0, 1 - uniqExactIf(prompt_hash, prompt_hash IS NOT NULL) / n_hashed, 0), 4)
        AS identical_prompt_share,
    round(sum(ifNull(cached_tokens, 0) * (input_usd_per_mtok - ifNull(cached_input_usd_per_mtok, 0))) / 1e6, 6)
        AS savings_usd
FROM attempts
WHERE source = 'worker'
GROUP BY model
ORDER BY model
