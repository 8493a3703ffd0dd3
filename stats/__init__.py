"""Paired statistics for two agents evaluated on identical episodes, and for GRPO regimes over training seeds.

Agents ``a`` and ``b`` are run on the same episodes and compared episode by episode, so every statistic
here is paired; the layouts they accept, the notation and the paired cells are in :mod:`.pairs`.

What is computed, and where:

- :mod:`.rates`         :func:`wilson_interval` for one rate, :func:`pass_at_k`, :func:`fold_episodes`.
- :mod:`.clusters`      :func:`cluster_labels`: episodes linked by a shared seed or item, one cluster.
- :mod:`.means`         :func:`mean_interval` and :func:`ratio_interval`: a mean of real-valued episodes (a KL
  summed over an episode) and a ratio of sums (per token), with the clustered two-stage bootstrap.
- :mod:`.paired`        the paired difference: :func:`paired_bootstrap` (two-stage, variance-component
  adjusted, expanded BCa interval), :func:`bayes_paired_interval` (Dirichlet posterior with the
  probability-matching factor, design effect) and :func:`mcnemar_exact`.
- :mod:`.verdicts`      :func:`compare` and its verdict by :data:`VERDICT_RULE`, :func:`headroom` (sampled
  against greedy per task), :func:`detectable_improvement`.
- :mod:`.regimes`       :func:`regime_interval` and :func:`regime_tost`: a regime's change over training
  seeds, the seed a random effect.
- :mod:`.correlation`   :func:`correlation_ci`: Pearson or Spearman with a pairs-bootstrap interval.
- :mod:`.results`       the frozen result dataclasses; :mod:`.quantiles` the normal and Student-t
  quantiles the intervals read, and the BCa and weighted percentiles.

Every interval for a difference is clipped to [−1, 1], the range of a difference of two rates. All
randomness comes from ``numpy.random.default_rng(seed)`` (PCG64); every result records its level,
resample or draw count, seed and (where there is one) prior, and a ``method`` string naming its formula.

References
    Abramowitz & Stegun (1964), Handbook of Mathematical Functions, §26.7 (Student's t).
    Agresti & Min (2005), Simple improved confidence intervals for comparing matched proportions. Stat.
        Med. 24:729–740.
    Brown, Cai & DasGupta (2001), Interval estimation for a binomial proportion. Stat. Sci. 16:101–133.
    Cameron, Gelbach & Miller (2011), Robust inference with multiway clustering. J. Bus. Econ. Stat.
        29:238–249.
    Chen et al. (2021), Evaluating large language models trained on code. arXiv:2107.03374.
    Cochran (1977), Sampling Techniques, 3rd ed. Wiley.
    Datta & Ghosh (1995), On priors providing frequentist validity for Bayesian inference. Biometrika
        82:37–45.
    Davison & Hinkley (1997), Bootstrap Methods and their Application. Cambridge UP.
    DiCiccio & Efron (1996), Bootstrap confidence intervals. Stat. Sci. 11:189–228.
    Efron (1987), Better bootstrap confidence intervals. JASA 82:171–185.
    Efron & Tibshirani (1993), An Introduction to the Bootstrap. Chapman & Hall.
    Fagerland, Lydersen & Laake (2013), The McNemar test for binary matched-pairs data. BMC Med. Res.
        Methodol. 13:91.
    Field & Welsh (2007), Bootstrapping clustered data. J. R. Stat. Soc. B 69:369–390.
    Gelman et al. (2013), Bayesian Data Analysis, 3rd ed. (BDA3). CRC.
    Hall (1992), The Bootstrap and Edgeworth Expansion. Springer.
    Hesterberg (2015), What teachers should know about the bootstrap. Am. Stat. 69:371–386.
    McNemar (1947), Note on the sampling error of the difference between correlated proportions or
        percentages. Psychometrika 12:153–157.
    Newcombe (1998), Two-sided confidence intervals for the single proportion. Stat. Med. 17:857–872.
    Owen (2007), The pigeonhole bootstrap. Ann. Appl. Stat. 1:386–411.
    Rao & Scott (1992), A simple method for the analysis of clustered binary data. Biometrics 48:577–585.
    Satterthwaite (1946), An approximate distribution of estimates of variance components. Biometrics
        Bull. 2:110–114.
    Schuirmann (1987), A comparison of the two one-sided tests procedure and the power approach for
        assessing the equivalence of average bioavailability. J. Pharmacokinet. Biopharm. 15:657–680.
    Tarjan (1975), Efficiency of a good but not linear set union algorithm. J. ACM 22:215–225.
    Tibshirani (1989), Noninformative priors for one parameter of many. Biometrika 76:604–608.
    Welch & Peers (1963), On formulae for confidence points based on integrals of weighted likelihoods.
        J. R. Stat. Soc. B 25:318–329.
    Wilson (1927), Probable inference, the law of succession, and statistical inference. JASA 22:209–212.
"""

from .clusters import cluster_labels
from .correlation import correlation_ci
from .means import MeanInterval, mean_interval, ratio_interval
from .paired import MIN_DISCORDANT, bayes_paired_interval, cluster_bootstrap_factors, mcnemar_exact, paired_bootstrap
from .rates import fold_episodes, pass_at_k, wilson_interval
from .regimes import regime_interval, regime_tost
from .results import (
    BETTER,
    NO_CHANGE,
    VERDICT_RULE,
    WORSE,
    BayesInterval,
    BootstrapInterval,
    Comparison,
    CorrelationInterval,
    DetectableImprovement,
    Headroom,
    HeadroomTable,
    McNemarResult,
    RateInterval,
    RegimeEquivalence,
    RegimeInterval,
)
from .verdicts import compare, detectable_improvement, headroom

__all__ = [
    "BETTER", "WORSE", "NO_CHANGE", "VERDICT_RULE", "MIN_DISCORDANT", "RateInterval", "BootstrapInterval",
    "BayesInterval", "McNemarResult", "Comparison", "Headroom", "HeadroomTable", "RegimeInterval",
    "RegimeEquivalence", "DetectableImprovement", "CorrelationInterval", "wilson_interval", "fold_episodes",
    "cluster_labels", "paired_bootstrap", "bayes_paired_interval", "mcnemar_exact", "compare", "headroom",
    "regime_interval", "regime_tost", "detectable_improvement", "pass_at_k", "correlation_ci",
    "cluster_bootstrap_factors", "MeanInterval", "mean_interval", "ratio_interval",
]
