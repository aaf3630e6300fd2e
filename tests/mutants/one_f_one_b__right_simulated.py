"""Right, written another way: walk the stage's work as a queue, running a backward as soon
as the stage holds p - s micro-batches or no forward is left."""


def one_f_one_b(stage_index, num_stages, n_microbatches):
    limit, order, forward, backward = num_stages - stage_index, [], 0, 0
    while backward < n_microbatches:
        if forward < n_microbatches and forward - backward < limit:
            order.append(("F", forward))
            forward += 1
            if forward - backward < limit and forward < n_microbatches:
                continue
        if forward - backward == limit or forward == n_microbatches:
            order.append(("B", backward))
            backward += 1
    return order


def last_stage_loss(loss_fn, output, target, n_microbatches):
    return loss_fn(output, target)
