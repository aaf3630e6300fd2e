"""Reading the accuracy-against-batch curve: what the benchmark reports and lesson 18 quotes.

    table = accuracy_table(rows)        # {(recipe, batch): (mean, low, high)} over seeds
    low, high = flat_range(table, "linear_warmup")   # batches within 1 point of batch 64's
    s_min, e_min = fit_steps(batches, steps)         # McCandlish's (S/S_min-1)(E/E_min-1) = 1
    table, spans, fit, b_simple = summary(rows)      # all of it, as the benchmark reports it

rows are dicts with recipe, batch, seed, test_accuracy (percent) and, where a target was
reached, steps_to_target (figures/large_batch.csv).
"""
import math
import statistics

REFERENCE_BATCH, TOLERANCE = 64, 1.0  # "flat": within 1 percentage point of batch 64's mean
RECIPES = ("none", "sqrt", "linear", "linear_warmup", "lars")


def accuracy_table(rows):
    """{(recipe, batch): (mean, min, max)} of test_accuracy over the seeds."""
    runs = {}
    for r in rows:
        runs.setdefault((r["recipe"], int(r["batch"])), []).append(float(r["test_accuracy"]))
    return {k: (statistics.fmean(v), min(v), max(v)) for k, v in runs.items()}


def flat_range(table, recipe, reference=REFERENCE_BATCH, tolerance=TOLERANCE):
    """(smallest, largest) batch of the unbroken run of batches around `reference` whose mean
    accuracy stays within `tolerance` points of the reference batch's; None if not measured."""
    batches = sorted(b for r, b in table if r == recipe)
    if reference not in batches:
        return None
    floor = table[recipe, reference][0] - tolerance
    i = j = batches.index(reference)
    while i > 0 and table[recipe, batches[i - 1]][0] >= floor:
        i -= 1
    while j + 1 < len(batches) and table[recipe, batches[j + 1]][0] >= floor:
        j += 1
    return batches[i], batches[j]


def width(span):
    """How many times wider the largest batch of a range is than its smallest."""
    return span[1] / span[0]


def fit_steps(batches, steps):
    """(S_min, E_min) of S(B) = S_min + E_min / B, least squares in 1/B.

    (S / S_min - 1)(E / E_min - 1) = 1 with E = S B is the same curve: S_min steps at least
    (infinite batch), E_min examples at least (batch 1); B_crit = E_min / S_min."""
    pairs = [(1.0 / b, s) for b, s in zip(batches, steps) if s is not None and math.isfinite(s)]
    if len(pairs) < 2:
        raise ValueError("fit_steps needs at least 2 batches that reached the target")
    mx = statistics.fmean(x for x, _ in pairs)
    my = statistics.fmean(y for _, y in pairs)
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    e_min = sum((x - mx) * (y - my) for x, y in pairs) / sxx
    return my - e_min * mx, e_min


def summary(rows):
    """(table, {recipe: flat range}, (S_min, E_min) or None, B_simple or None).

    The fit takes linear_warmup's steps to the target (the mean over seeds per batch);
    B_simple is the median over linear_warmup's runs of their estimate (moving averages) when
    they reached the target; a run whose average of |G|^2 was not above 0 then has none."""
    table = accuracy_table(rows)
    spans = {r: flat_range(table, r) for r in RECIPES}
    reached = {}
    for r in rows:
        if r["recipe"] == "linear_warmup" and r["steps_to_target"] not in ("", None):
            reached.setdefault(int(r["batch"]), []).append(float(r["steps_to_target"]))
    fit = None
    if len(reached) >= 2:
        batches = sorted(reached)
        fit = fit_steps(batches, [sum(reached[b]) / len(reached[b]) for b in batches])
    noise = sorted(float(r["b_simple"]) for r in rows if r["recipe"] == "linear_warmup" and
                   r["b_simple"] not in ("", None) and 0 < float(r["b_simple"]) < math.inf)
    return table, spans, fit, (noise[len(noise) // 2] if noise else None)
