"""The compute order of one stage under a schedule, for the tools that make sample traces and logs."""


def one_f_one_b(stage, stages, microbatches):
    """1F1B on `stage`: warm-up forwards, then one forward one backward, then the remaining backwards."""
    warmup = min(stages - 1 - stage, microbatches)
    order = [("F", m) for m in range(warmup)]
    f, b = warmup, 0
    while b < microbatches:
        if f < microbatches:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
        b += 1
    return order


def gpipe(stage, stages, microbatches):
    """GPipe: every forward, then every backward."""
    return [("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)]
