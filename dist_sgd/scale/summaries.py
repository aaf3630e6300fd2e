"""What the network CSVs stand for, computed from their rows alone: the summaries lessons 10
and 12 quote and the benchmark reports (figures/netscale.csv, nettrain.csv, netaccuracy.csv,
compress.csv; read with dist_sgd.plumbing.figures.read_csv)."""
from dist_sgd.scale import cluster, costmodel


MiB = 2 ** 20
MODEL_OF = {"gloo": "ring"}  # the cost model's line for each all-reduce: gloo's is a ring
NETACCURACY_TARGET = 0.80  # netaccuracy.csv: the test accuracy each method's time is taken at
COMPRESS_LINK = "1 Gbit/s link, 2 nodes"  # compress.csv's network column on lesson 11's cluster


def netscale_fit(rows):
    """(alpha, beta) of netscale.csv, fitted once to the 2-node cluster's ping-pong (every
    cluster's links are alike; the all-reduces it predicts never enter the fit)."""
    return costmodel.fit_shaped_link([r for r in rows
                                      if r["part"] == "ping-pong" and r["nodes"] == 2])


def cpu_share(rows):
    """(kappa, per_byte, cores): this machine's share of a message, from a network CSV's "cpu"
    rows (netscale's or nettrain's 2-node cluster, dist_sgd.comm.p2p.exchange_cpu, measured
    alone); None if there are none."""
    cpu = [r for r in rows if r["part"] == "cpu"]
    if len({r["bytes"] for r in cpu}) < 2:
        return None
    return (*costmodel.fit_cpu(cpu), int(cpu[0]["cores"]))


def netscale_with_model(rows):
    """Add both predictions to every row of netscale.csv: `model_link`, the link alone
    (netscale_fit), and `model`, the link and this machine's CPU (cpu_share; the link alone
    where the CSV has no CPU rows)."""
    alpha, beta = netscale_fit(rows)
    cpu = cpu_share(rows)
    for r in rows:
        algorithm = MODEL_OF.get(r["algorithm"], r["algorithm"])
        if r["part"] == "ping-pong":
            r["model"] = r["model_link"] = alpha + beta * r["bytes"]
        elif r["part"] == "all-reduce":
            r["model_link"] = costmodel.predict_all_reduce(algorithm, r["bytes"], r["nodes"],
                                                           alpha, beta)
            r["model"] = costmodel.predict_all_reduce(algorithm, r["bytes"], r["nodes"], alpha,
                                                      beta, cpu=cpu)
        else:
            r["model"] = r["model_link"] = ""
    return rows


def netscale_table(rows):
    """{(algorithm, nodes, bytes): row} of netscale.csv's all-reduces."""
    return {(r["algorithm"], r["nodes"], r["bytes"]): r for r in rows if r["part"] == "all-reduce"}


def measured_crossover(small, ring):
    """Where the ring overtakes `small` (an algorithm that wins on small messages) in measured
    {bytes: seconds}: (last size `small` wins, first size from which the ring always does);
    (None, first) if the ring wins everywhere, (last, None) if it never catches up."""
    sizes = sorted(set(small) & set(ring))
    wins = [n for n in sizes if small[n] < ring[n]]
    if not wins:
        return None, sizes[0] if sizes else None
    later = [n for n in sizes if n > wins[-1]]
    return wins[-1], later[0] if later else None


CROSSING = ("tree", "halving_doubling")  # the algorithms whose crossover with the ring is shown


def netscale_summary(rows):
    """What figures/netscale.png stands for: the lowest bus bandwidth of gloo and our ring as a
    share of the link's rate, our ring / gloo at worst, each model's worst error per algorithm
    ({"model": {algorithm: (error, (algorithm, nodes, bytes))}, "model_link": ...}), all at
    >= 1 MiB; and per (algorithm in CROSSING, node count) where the ring overtakes it:
    measured (measured_crossover) and predicted by each model (costmodel.crossover: bytes,
    None if never)."""
    ar = netscale_table(netscale_with_model(rows))
    alpha, beta = netscale_fit(rows)
    cpu = cpu_share(rows)
    rate = cluster.parse_rate(cluster.SCALING_RATE) / 8  # bytes/s
    ps = sorted({p for _, p, _ in ar})
    big = [k for k in ar if k[2] >= MiB]
    bus = {a: min(costmodel.bus_bandwidth(n, p, ar[a, p, n]["seconds"]) / rate
                  for b, p, n in big if b == a) for a in ("gloo", "ring")}
    ratio = max(ar["ring", p, n]["seconds"] / ar["gloo", p, n]["seconds"]
                for a, p, n in big if a == "ring" and ("gloo", p, n) in ar)
    algorithms = dict.fromkeys(a for a, _, _ in ar)
    error = {m: {a: max((abs(ar[k][m] / ar[k]["seconds"] - 1), k) for k in big if k[0] == a)
                 for a in algorithms if any(k[0] == a for k in big)}
             for m in ("model", "model_link")}
    crossover = {}
    for a in CROSSING:
        for p in ps:
            mine = {n: r["seconds"] for (b, q, n), r in ar.items() if b == a and q == p}
            ring = {n: r["seconds"] for (b, q, n), r in ar.items() if b == "ring" and q == p}
            if mine and ring:
                crossover[a, p] = {"measured": measured_crossover(mine, ring),
                                   "model": costmodel.crossover(a, "ring", p, alpha, beta, cpu),
                                   "model_link": costmodel.crossover(a, "ring", p, alpha, beta)}
    return {"bus": bus, "ring/gloo": ratio, "error": error, "crossover": crossover,
            "cpu": cpu}


def crossover_words(c):
    """One crossover of netscale_summary as words: 'measured 64 KiB-256 KiB; model 120 KiB
    (link alone 93 KiB)'."""
    low, high = c["measured"]
    hb = costmodel.human_bytes
    measured = ("ring as fast or faster at every size" if low is None else
                f"not by {hb(low)}, the largest size" if high is None else
                f"between {hb(low)} and {hb(high)}")
    model = {m: "never" if c[m] is None else "at every size" if c[m] <= 1 else hb(c[m])
             for m in ("model", "model_link")}
    return f"measured {measured}; model {model['model']} (link alone {model['model_link']})"


def nettrain_table(rows):
    """{(name, nodes): row} of nettrain.csv's steps and the parts measured alone."""
    return {(r["name"], r["nodes"]): r for r in rows if r["part"] in ("step", "alone")}


def nettrain_efficiency(rows):
    """{(strategy, p): (efficiency, CPU share)} of nettrain.csv, strategies in the CSV's order:
    samples/s per node at p over one node's with no communication; CPU share = compute at 1 node
    / compute at p (the best any strategy does)."""
    t = nettrain_table(rows)
    one = t["compute", 1]["seconds"]
    return {(n, p): (one / r["seconds"], one / t["compute", p]["seconds"])
            for (n, p), r in t.items() if r["part"] == "step"}


def netaccuracy_summary(rows):
    """{method: {"seconds", "bytes", "step" to NETACCURACY_TARGET (None if never), "final"
    accuracy, "total_seconds", "total_bytes"}} of netaccuracy.csv's curves."""
    out = {}
    for method in dict.fromkeys(r["method"] for r in rows if r["part"] == "curve"):
        curve = [r for r in rows if r["part"] == "curve" and r["method"] == method]
        hit = next((r for r in curve if r["accuracy"] >= NETACCURACY_TARGET), None)
        out[method] = {"seconds": hit and hit["seconds"], "bytes": hit and hit["bytes"],
                       "step": hit and hit["step"], "final": curve[-1]["accuracy"],
                       "total_seconds": curve[-1]["seconds"], "total_bytes": curve[-1]["bytes"]}
    return out


def compress_link(rows):
    """{impl: row} of compress.csv's rows measured on lesson 11's cluster ({} if none)."""
    return {r["impl"]: r for r in rows if r.get("network") == COMPRESS_LINK}


def compress_link_lines(link):
    """The link rows ({impl: row}) as lines, each with its ratio to torch's DDP uncompressed."""
    plain = link["torch DDP, no compression"]
    lines = [f"{COMPRESS_LINK} (lesson 11's cluster), BigNet, {plain['batch_per_rank']} samples "
             f"per node, medians of {plain['n']} alternated steps (slowest rank):"]
    for name, r in link.items():
        lines.append(f"  {name:42s} {r['median_s'] * 1e3:6.1f} ms  "
                     f"{r['median_s'] / plain['median_s']:5.2f}x  "
                     f"{costmodel.human_bytes(r['bytes_per_step']):>9s} per step into all-reduce")
    return lines
