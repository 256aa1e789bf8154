# The statistics behind the lab's ratio tools (bench-ratios, pooled-ratios
# load this with awk -f before their own program).

# median(a, m): the median of a[1..m] (sorts a).
function median(a, m,   i, j, tmp) {
  for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { tmp = a[j]; a[j] = a[j - 1]; a[j - 1] = tmp }
  return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}

# geo_stats(r, m): the geometric mean of the ratios r[1..m] in GEO and its
# 95% interval (mean of the logs +- 1.96 standard errors) in GEO_LO..GEO_HI;
# returns 0, setting nothing, for fewer than 3 ratios. A 10% target holds
# robustly only if GEO_LO is at least 0.90.
function geo_stats(r, m,   i, s, ss, mean, se) {
  if (m < 3) return 0
  s = 0; for (i = 1; i <= m; i++) s += log(r[i])
  mean = s / m
  ss = 0; for (i = 1; i <= m; i++) ss += (log(r[i]) - mean) ^ 2
  se = sqrt(ss / (m - 1) / m)
  GEO = exp(mean); GEO_LO = exp(mean - 1.96 * se); GEO_HI = exp(mean + 1.96 * se)
  return 1
}
