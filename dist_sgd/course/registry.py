"""Every exercise of the course: what the learner writes, where the reference lives, and the
hints, from gentle to nearly the answer (exercises.py sorts them in the lessons' order).

An exercise's reference is the library's (or a lesson's) own code, with its region marked
(see skeleton.py); its grader is dist_sgd/course/graders/<name>.py, and the wrong versions it
is proven to reject are tests/mutants/<name>__*.py. Adding one: README.md, "Your turn".
"""
from dist_sgd.course.exercise import Exercise

# In any order: exercises.py sorts them by lesson.
ENTRIES = (
    Exercise(
        "ring_sum", "02", "lessons/02_point_to_point.py", ("ring_sum",),
        "return the sum of every rank's tensor, passed p-1 times to the right around a ring "
        "with blocking send/recv, adding what arrives, without a deadlock",
        ("Rank r sends to (r + 1) % p and receives from (r - 1) % p. Keep a running total "
         "(a copy of the tensor) and the tensor travelling on; p - 1 steps.",
         "Each step: receive into a fresh buffer, add it to the total, and pass that buffer on "
         "at the next step (what arrived, never the total: that would count ranks twice).",
         "A blocking send waits until its receiver has posted the receive: if every rank sends "
         "first, every rank waits forever. Some rank must listen first.",
         "if rank % 2 == 0: dist.send(travelling, right); dist.recv(arrived, left) "
         "else: the same two calls, the other way round. Then total += arrived; "
         "travelling = arrived."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "broadcast", "03", "dist_sgd.comm.textbook", ("broadcast",),
        "copy src's tensor into every rank's, in place, down a binomial tree of send/recv: "
        "ceil(log2 p) rounds, every rank receiving once",
        ("Number the ranks from src: me = (rank - src) % p, so src is 0. Whoever has the "
         "tensor sends it on; the ranks that have it double every round.",
         "Before round k the ranks me < 2^k have it: each sends to me + 2^k (if that is < p), "
         "and the ranks 2^k <= me < 2^(k+1) receive from me - 2^k.",
         "Convert back to real ranks: the peer of a send is (rank + 2^k) % p, of a receive "
         "(rank - 2^k) % p. Receive straight into tensor: it is the result.",
         "have = 1; while have < p: if me < have and me + have < p: dist.send(tensor, (rank + "
         "have) % p) elif have <= me < 2 * have: dist.recv(tensor, (rank - have) % p); "
         "have *= 2"),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "all_gather", "03", "dist_sgd.comm.textbook", ("all_gather",),
        "put every rank's tensor into every rank's tensor_list (entry i from rank i), around "
        "a ring of isend/irecv: p-1 steps, each rank passing on what it got last",
        ("Your own entry first: tensor_list[rank] is a copy of tensor. Rank r sends to "
         "(r + 1) % p and receives from (r - 1) % p.",
         "At step s pass entry (r - s) % p on (your own at step 0, then the one that just "
         "arrived) and receive entry (r - s - 1) % p from the left.",
         "Receive straight into tensor_list[(r - s - 1) % p]: no buffer, no copy. Each rank "
         "sends p - 1 tensors in all, never the whole list.",
         "Post the receive first: req = dist.irecv(tensor_list[take], left); "
         "dist.send(tensor_list[give], right); req.wait()."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "reduce_scatter", "03", "dist_sgd.comm.textbook", ("reduce_scatter",),
        "rank i's output = the sum over every rank of its input_list[i], around a ring of "
        "isend/irecv, the inputs left as they were",
        ("Work on copies: partial = [t.clone() for t in input_list] (torch leaves input_list "
         "alone). Rank r sends to (r + 1) % p and receives from (r - 1) % p.",
         "p - 1 steps; each step sends one partial sum to the right and adds the one arriving "
         "from the left into your own copy of that entry. After the last, entry r is complete.",
         "At step s send partial[(r - s - 1) % p] and add the arriving one into "
         "partial[(r - s - 2) % p]: at the last step that is entry r itself.",
         "req = dist.irecv(inbox, left); dist.send(partial[give], right); req.wait(); "
         "partial[take] += inbox. At the end output.copy_(partial[rank])."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "ring_all_reduce", "04", "lessons/04_allreduce_algorithms.py", ("ring_all_reduce",),
        "sum x over every rank, in place, around a ring of isend/irecv: a reduce-scatter of p "
        "chunks, then an all-gather",
        ("Cut x into p chunks with x.tensor_split(p): views, so writing into a chunk writes x. "
         "Rank r sends to (r + 1) % p and receives from (r - 1) % p.",
         "Reduce-scatter, p - 1 steps: at step s send chunk (r - s - 1) % p to the right and add "
         "the chunk arriving from the left, (r - s - 2) % p, into yours. Then chunk r is complete.",
         "All-gather, p - 1 steps: at step s send chunk (r - s) % p (complete) and copy the "
         "arriving chunk (r - s - 1) % p into place. Each message is one chunk, never all of x.",
         "In every step post the receive first: req = dist.irecv(inbox, left); "
         "dist.send(chunk, right); req.wait(). Receive into a buffer, then add or copy it."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "ShardSampler", "05", "dist_sgd.sgd.partition", ("ShardSampler",),
        "this rank's share of the dataset's indices, index for index DistributedSampler's: "
        "one seeded order for all ranks, padded (or cut with drop_last) to a multiple of "
        "num_replicas, then every num_replicas-th index from position rank",
        ("Every rank must draw the same order without talking: seed a torch.Generator with "
         "self.seed + self.epoch (set_epoch changes the epoch) and take torch.randperm(n, "
         "generator=g).tolist(); with shuffle=False the order is 0, 1, ..., n - 1.",
         "The length first: every rank gets the same count, math.ceil(n / num_replicas) (or "
         "n // num_replicas with drop_last), so total_size = num_samples * num_replicas.",
         "Without drop_last pad the order to total_size by repeating it from its start "
         "(order + order[:padding], over and over when n < num_replicas); with drop_last cut "
         "it: order[:total_size].",
         "A strided split, not blocks: rank r takes order[r:total_size:num_replicas] "
         "(positions r, r + R, r + 2R, ...), and __iter__ returns iter() of that list."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "average_gradients", "06", "dist_sgd.sgd.sync", ("average_gradients",),
        "replace every parameter's .grad by its mean over all ranks, in place (all-reduce with "
        "SUM, then divide by the world size)",
        ("model.parameters() gives each parameter once (a tied weight too); skip those whose "
         ".grad is None (frozen, or unused in this forward pass).",
         "dist.all_reduce(p.grad, op=dist.ReduceOp.SUM) leaves the sum of every rank's gradient "
         "in p.grad on every rank; the mean needs one more step.",
         "Divide by dist.get_world_size(), once: p.grad /= world_size (in place, so the "
         "optimizer sees it)."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "hook_ddp", "07", "dist_sgd.ddp.steps", ("HookDDP",),
        "HookDDP._grad_ready: as soon as autograd has a parameter's gradient, start averaging "
        "it over the ranks, asynchronously, and make backward() wait for every one at its end",
        ("The hook runs once per parameter, while backward is still computing the layers below: "
         "start the all-reduce and return at once (a Future), so the network works meanwhile.",
         "An average is a sum divided by p: divide param.grad by self.world_size first, then "
         "sum it in place: start_all_reduce(param.grad, self.all_reduce) returns its Future.",
         "Nothing may use the gradients before they are summed: on the first gradient of a "
         "backward (self._futures still empty) ask call_when_backward_ends to run "
         "self.finish_gradient_synchronization, which waits for every Future.",
         "if not self._futures: call_when_backward_ends(self.finish_gradient_synchronization); "
         "param.grad.div_(self.world_size); future = start_all_reduce(param.grad, "
         "self.all_reduce)"),
        world_sizes=(1, 2, 3)),
    Exercise(
        "bucketed_ddp", "07", "dist_sgd.ddp.bucketed", ("BucketedDDP",),
        "BucketedDDP._launch_complete_buckets: start averaging every complete bucket from "
        "self._next on, strictly in bucket order, each through in_order",
        ("Every rank must issue the same all-reduces in the same order, so buckets go in index "
         "order: bucket self._next first, and only once all of it is ready (bucket.ready).",
         "One gradient can complete several buckets at once (at the end of backward the "
         "unused parameters' buckets are filled together): keep launching while the next one "
         "is complete, and stop at the last bucket.",
         "A bucket's average: self.reduce(bucket) when a communication hook is set (the "
         "gradients were copied unscaled), else _all_reduce(bucket.flat) (already times 1/p). "
         "Either goes through in_order(start, later=...), later=True for a hook; keep its "
         "Future in bucket.future.",
         "while self._next < len(self.buckets) and all(self.buckets[self._next].ready): "
         "bucket = self.buckets[self._next]; bucket.future = in_order(lambda b=bucket: "
         "self.reduce(b) if self.reduce else _all_reduce(b.flat), later=self.reduce is not "
         "None); self._next += 1"),
        world_sizes=(1, 2, 3)),
    Exercise(
        "DataParallel", "08", "dist_sgd.ddp.data_parallel", ("scatter", "gather", "DataParallel"),
        "one process, several replicas: scatter the batch into chunks, run a replica on each "
        "in its own thread, gather the outputs into one; one backward sums the gradients",
        ("scatter(obj, devices, dim): a tensor becomes obj.chunk(len(devices), dim), one chunk "
         "per device (.to(device)); torch's chunk may give fewer chunks than devices (5 rows on "
         "4 devices: 2 + 2 + 1), and then fewer replicas run.",
         "Containers: scatter each element, then zip the per-device pieces back into the same "
         "type (tuple, list, dict, namedtuple); anything else (a float, a string, None) goes to "
         "every device as it is. gather is the mirror: torch.cat along dim, then rebuild.",
         "gather: 0-d tensors (a loss per replica) become a vector, one entry per replica "
         "(o.view(1), with a warning); None stays None; dicts keep their keys in order.",
         "forward: ins, kws = scatter_kwargs(inputs, kwargs, devices, dim); replicas = "
         "replicate(module, devices[:len(ins)]); outs = parallel_apply(replicas, ins, devices, "
         "kws); return gather(outs, output_device, dim). No all-reduce: backward through "
         "replicate's copies sums every replica's gradient."),
        world_sizes=(1,)),
    Exercise(
        "fp16_compress_hook", "12", "dist_sgd.ddp.compress", ("fp16_compress_hook",),
        "a DDP communication hook that averages the bucket in float16: half the bytes on the "
        "wire, the result back in the bucket's dtype",
        ("A hook gets (process_group, bucket) and returns a Future whose value is the averaged "
         "flat gradient: bucket.buffer() is that flat tensor, process_group may be None (the "
         "default group).",
         "Compress: half = buffer.to(torch.float16). Divide by the world size before the sum, "
         "not after: float16 overflows at 65504.",
         "fut = dist.all_reduce(half, group=group, async_op=True).get_future(); its value is a "
         "list holding the summed tensor.",
         "return fut.then(decompress), where decompress(f) copies f.value()[0] into buffer "
         "(buffer.copy_ casts float16 back to the bucket's dtype) and returns buffer."),
        world_sizes=(1, 2, 3)),
    Exercise(
        "powerSGD_hook", "12", "dist_sgd.ddp.compress",
        ("powerSGD_hook", "_power_sgd", "add_error_feedback", "compute_p", "compute_q",
         "decompress", "keep_residual"),
        "PowerSGD's arithmetic with error feedback: each gradient matrix M sent as P = M Q and "
        "Q = M^T P (rank r), M rebuilt as P Q^T, what that drops kept for the next step",
        ("Five small steps, each its own function; _power_sgd chains them on the all-reduces. "
         "add_error_feedback: add state.error_dict[index] (last step's residual) into the "
         "buffer, or create it as zeros the first time; return a copy of the buffer as it is "
         "now (before), to measure at the end what compression dropped.",
         "compute_p: P = M Q for each matrix with its Q: p.copy_(mat @ q). The P's are then "
         "summed over the ranks (_power_sgd does it): summing is linear, so every rank gets "
         "the projection of the summed gradient.",
         "compute_q, once the P's are summed: orthogonalize(p, epsilon) for each, then "
         "q.copy_(mat.t() @ p). Orthogonalizing is not linear: it must come after the sum.",
         "decompress, after the Q's are summed: q_flat.div_(world_size); then "
         "torch.matmul(p, q.t(), out=mat). keep_residual: state.error_dict[index] = before - "
         "buffer (this rank's gradient minus what the ranks agreed on), in place."),
        world_sizes=(1, 2, 3)),
    Exercise(
        "ShardedOptimizer", "13", "dist_sgd.shard.zero", ("ShardedOptimizer",),
        "the ZeRO-1 step: each rank steps only its own shard of the parameters (so it holds "
        "that shard's optimizer state only), then every parameter is broadcast from its owner",
        ("The wrapped optimizer must see only this rank's parameters: build it from "
         "self._local_group(group, owners) for each of self.param_groups and self.owners.",
         "step(), broadcast scheme: average every gradient first (average_gradients(self."
         "_trainable(), flat=True, all_reduce=self.comm.all_reduce) when reduce_gradients), "
         "then self.optim.step(**kwargs): only this rank's shard moves.",
         "Then share: shards[r] (self.shard(r)) lists the parameters rank r owns and has just "
         "updated; each must reach every other rank from r, the only one that stepped it.",
         "_broadcast_shards: for r, s in enumerate(shards): for p in s: "
         "self.comm.broadcast(p, src=r) (a non-contiguous p: broadcast p.contiguous(), copy it "
         "back); log ('broadcast', bytes) in self.comm_log."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "save_checkpoint", "14", "dist_sgd.faults.checkpoint",
        ("save_checkpoint", "load_checkpoint"),
        "a checkpoint that resumes bit for bit: save_checkpoint writes the model, the optimizer, "
        "the step and this rank's random generators; load_checkpoint puts the latest back and "
        "returns {\"step\": ...} (None when the folder holds none)",
        ("Every rank calls both. The model's and the optimizer's state_dict() hold the weights "
         "and the momentum (and the learning rate); torch.save / torch.load write and read them.",
         "A resumed run draws the same dropout masks, data and jitter only if the generators "
         "come back too: torch.get_rng_state() and random.getstate() (rng_state() here has "
         "them all), set back with torch.set_rng_state / random.setstate (set_rng_state).",
         "Each rank's generators are its own: save them per rank (rank-{rank}.pt), not rank "
         "0's for everyone. The model and optimizer are the same on every rank: rank 0 may "
         "write them once (then a dist.barrier() before anyone reads).",
         "Several checkpoints in one folder: write step-{step:08d}/ and then a small file "
         "naming it (latest); load reads that name. Return {\"step\": step} from the load."),
        world_sizes=(1, 2, 3)),
    Exercise(
        "fsdp_unit", "16", "dist_sgd.shard.fsdp_unit", ("_Unit",),
        "one FSDP unit's gather (all-gather each flat piece into a storage grown for it), free "
        "(the storage back to 0 bytes) and reduce-scatter (each rank gets the mean of its piece "
        "of the gradient)",
        ("Shard i's full flat tensor is self.tensor(i, (self.numels[i],)) once its storage is "
         "resized to numels[i] * itemsize(dtypes[i]) bytes; .split(s.size) cuts it into the p "
         "pieces an all-gather fills: self.comm.start(\"all_gather\", pieces, my_piece).",
         "Cast your piece to self.dtypes[i] before sending, keep it in self.works with the "
         "handle until the gather is done, and count self.nbytes in self.memory. free(): wait "
         "first (a gather in flight writes into the storage), then storage.resize_(0).",
         "Reduce-scatter: a gradient of s.numel elements padded with zeros to s.size * p (plus "
         "s.accumulated if no_sync kept one); under sync=False keep that as s.accumulated. "
         "Otherwise out = s.param.new_empty(s.size) and "
         "self.comm.start(\"reduce_scatter\", out, list(flat.split(s.size))).",
         "finish_reduce(): wait for each handle, divide out by self.world_size (the sum -> the "
         "mean), then s.param.grad = out, or add it when .grad is already there; empty "
         "self.reducing and count the flat buffers' bytes back out of self.memory."),
        world_sizes=(1, 2, 3)),
    Exercise(
        "SGD", "06", "dist_sgd.sgd.optim", ("SGD",),
        "torch.optim.SGD's update of each parameter, in place: maximize, weight decay, "
        "momentum (with dampening), Nesterov, the step; a parameter whose .grad is None is "
        "skipped",
        ("Work on a new tensor g, never on p.grad itself: g = -p.grad with maximize, else "
         "p.grad; weight decay then adds the L2 penalty's gradient, g = g.add(p, "
         "alpha=weight_decay). Skip p when p.grad is None.",
         "Momentum (mu) lives in self.state[p][\"momentum_buffer\"]. On p's first step the "
         "buffer is a copy of g (g.clone(): no dampening, no zeros); later b.mul_(mu).add_(g, "
         "alpha=1 - tau), tau the dampening.",
         "The direction to step: g + mu * b with nesterov, b without it, and g itself when "
         "mu is 0.",
         "Last, in place: p.add_(g, alpha=-lr). torch's order: maximize, weight decay, "
         "momentum, nesterov, step."),
        world_sizes=(1,)),
    Exercise(
        "LocalSGD", "15", "dist_sgd.beyond.local_sgd", ("average_parameters", "LocalSGD"),
        "the weights averaged over the ranks every `period` steps, on torch's "
        "PeriodicModelAverager's schedule: average_parameters(params), and LocalSGD.step's "
        "rule (warm-up first)",
        ("Average the parameters, not the gradients: after optimizer.step() each rank's copy "
         "has moved on its own; they must all become their mean, in place.",
         "average_parameters: one all-reduce of a flat copy does it: flat = flatten(params); "
         "dist.all_reduce(flat); flat /= world_size; copy_back(flat, params).",
         "The schedule counts step() calls from 0: call number c averages when c >= "
         "warmup_steps and (c - warmup_steps) % period == 0, so the first call after the "
         "warm-up averages, then every period-th.",
         "step(): due = that test; if due: self.sync() (it calls your average_parameters and "
         "counts self.syncs); self.counter += 1; return due."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "warmup_schedule", "18", "dist_sgd.large_batch.schedule", ("lr_at",),
        "the learning rate at a step: Goyal's gradual warmup from start_factor x peak_lr up "
        "to peak_lr, then a step or cosine decay whose clock starts when the warmup ends, "
        "equal to torch's LinearLR + SequentialLR + MultiStepLR / CosineAnnealingLR",
        ("Two phases. While step < warmup_steps the rate rises in equal steps; after that, "
         "the decay runs on its own clock t = step - warmup_steps (SequentialLR restarts it).",
         "The warmup starts at the small batch's rate, not at 0: at step 0 it is start_factor "
         "x peak_lr, and it rises every step (not every epoch), reaching peak_lr at "
         "step = warmup_steps.",
         "Warmup: peak_lr * (start_factor + (1 - start_factor) * step / warmup_steps). Step "
         "decay: peak_lr * gamma ** (number of milestones m with m <= t).",
         "Cosine: eta_min + (peak_lr - eta_min) * (1 + cos(pi * t / T)) / 2 with T = "
         "total_steps - warmup_steps; decay 'none': peak_lr."),
        world_sizes=(1,)),
    Exercise(
        "LARS", "18", "dist_sgd.large_batch.lars", ("LARS",),
        "one parameter tensor's LARS update (Algorithm 1): a trust ratio from |w| and |g|, "
        "weight decay inside it, a velocity that carries the learning rate; tensors with one "
        "dimension take plain momentum SGD",
        ("Per tensor: w = p, g = p.grad. Matrices and kernels (p.dim() > 1) get a trust ratio; "
         "biases and norms (p.dim() == 1) get neither trust ratio nor weight decay.",
         "trust = trust_coefficient * |w| / (|g| + weight_decay * |w| + eps), and 1 where |w| "
         "or |g| is 0 (a fresh zero layer must still move). Norms: p.norm(), g.norm().",
         "The velocity holds lr x the step, not the gradient: v = momentum * v + lr * trust * "
         "(g + weight_decay * w); then w = w - v. Keep v in self.state[p]['velocity'], "
         "starting at zeros.",
         "For p.dim() == 1: v = momentum * v + lr * g; p.sub_(v). For the rest use "
         "torch.where((w_norm > 0) & (g_norm > 0), trust, 1.0) for the ratio."),
        world_sizes=(1,)),
    Exercise(
        "noise_scale", "18", "dist_sgd.large_batch.noise", ("two_batch_estimates",),
        "|G|^2 and tr(Sigma), both unbiased, from the squared norms of gradients averaged over "
        "two batch sizes b_small < b_big (McCandlish et al. 2018, Appendix A)",
        ("One batch of B examples has E |G_B|^2 = |G|^2 + tr(Sigma) / B: the signal plus the "
         "noise over B. One batch size cannot tell the two apart; two can.",
         "Write the expectation at both sizes: small_sq = |G|^2 + tr / b_small, big_sq = "
         "|G|^2 + tr / b_big. Two linear equations, two unknowns.",
         "Subtract them for tr(Sigma): small_sq - big_sq = tr * (1 / b_small - 1 / b_big).",
         "g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small); trace = (small_sq - "
         "big_sq) / (1 / b_small - 1 / b_big); return g2, trace."),
        world_sizes=(1,)),
    Exercise(
        "SyncBatchNorm", "18", "dist_sgd.large_batch.syncbn", ("global_moments", "global_means"),
        "BatchNorm's statistics over every rank's items with all-reduce: the mean, variance, "
        "1/std and count in forward, and backward's two means of dy and dy * xhat",
        ("Means and variances do not add up across ranks; sums do. All-reduce per channel the "
         "sum of x, the sum of x^2 and the number of rows, in one tensor (one message).",
         "Then mean = sum / n and var = sum(x^2) / n - mean^2 (biased, as BatchNorm normalizes "
         "with), invstd = rsqrt(var + eps). Local batches may differ in size: n is the global "
         "count.",
         "Backward: the input gradient needs mean(dy) and mean(dy * xhat) over the global "
         "batch: both terms, all-reduced, or each rank's gradient misses the others' items.",
         "global_moments: stats = torch.cat([x2d.sum(0), (x2d * x2d).sum(0), count]); "
         "dist.all_reduce(stats). global_means: sums = torch.cat([dy2d.sum(0), (dy2d * "
         "xhat2d).sum(0)]); dist.all_reduce(sums); return sums[:c] / n, sums[c:] / n."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "one_f_one_b", "19", "dist_sgd.parallel.pipeline", ("one_f_one_b", "last_stage_loss"),
        "1F1B's order of work on one pipeline stage, a list of (\"F\", i) and (\"B\", i), and the "
        "loss the last stage runs backward from for one micro-batch",
        ("A backward needs its forward done on every later stage: the last stage can go "
         "forward, backward, forward, backward at once; the first must run ahead. Stage s runs "
         "p - 1 - s forwards before its first backward (never more than m).",
         "After the warm-up, alternate: the next forward, then the oldest backward, until every "
         "forward is done; then the backwards left (the cool-down). Count what you hold: "
         "never more than p - s micro-batches on stage s.",
         "The schedule divides every gradient by m once at the end (torch's scale_grads): the "
         "loss of one micro-batch is loss_fn(output, target), not divided again.",
         "warm = min(p - 1 - s, m); order = [F i for i < warm]; for i in range(m - warm): "
         "order += [(\"F\", warm + i), (\"B\", i)]; then (\"B\", i) for i from m - warm to m - 1."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "tp_operators", "20", "dist_sgd.parallel.tensor", ("CopyToParallel", "ReduceFromParallel"),
        "Megatron's conjugate operators as autograd Functions on our all_reduce: f (identity "
        "forward, all-reduce backward) and g (all-reduce forward, identity backward)",
        ("f sits before a column-parallel layer: every rank needs the whole x, which it already "
         "has. g sits after a row-parallel layer: each rank holds a partial sum of y.",
         "Backward is the mirror: through f, each rank's gradient of x covers only its slice of "
         "the layer, so the ranks' gradients must be summed; through g, y = sum of the parts, "
         "so each part's gradient is y's gradient, unchanged.",
         "Never reduce autograd's tensor in place: all_reduce a clone (or .contiguous().clone()). "
         "backward returns one gradient per forward argument: (grad, None, None).",
         "f: forward returns x.view_as(x); backward: g2 = grad.clone(); all_reduce(g2, "
         "group=ctx.group); _log(ctx.log, g2, \"f\", \"backward\"); return g2, None, None. "
         "g: the same two, the other way round, noted as _log(log, y, \"g\", \"forward\")."),
        world_sizes=(1, 2, 3, 4)),
    Exercise(
        "parallel_linear", "20", "dist_sgd.parallel.tensor",
        ("ColumnParallelLinear", "RowParallelLinear"),
        "a linear layer split by its outputs (ColumnParallelLinear) and one split by its inputs "
        "(RowParallelLinear): forward, and from_linear taking this rank's slice of an nn.Linear",
        ("nn.Linear's weight is (out_features, in_features). Column-parallel: rank r keeps "
         "out_features / p rows (and that slice of the bias); row-parallel: in_features / p "
         "columns, and the whole bias.",
         "Column forward: f(x) (CopyToParallel), then F.linear with your slice: your slice of y. "
         "With gather_output, all-gather the slices along the last dimension "
         "(GatherFromParallel).",
         "Row forward: unless input_is_parallel, take your slice of x's last dimension "
         "(ScatterToParallel); F.linear without the bias gives a partial sum; g adds them up. "
         "Add the bias after g: added before, it would count p times.",
         "from_linear: weight.chunk(p, dim=0)[rank] for a column layer, chunk(p, dim=1)[rank] "
         "for a row layer, copied under torch.no_grad(). Pass self.group and self.log on to "
         "f and g; a layer built with bias=False has self.bias None."),
        world_sizes=(1, 2, 3, 4)),
)
