"""PowerSGD's steps written plainly, another way than the reference: the residual kept in a
fresh clone, P and Q by the @ operator as the paper writes them, Q averaged per matrix after
the product, M written back with copy_, the residual as a new tensor stored in the dict.

Written as changes to the reference (dist_sgd/course/skeleton.reference): each (old, new)
replaces text that occurs once in it, so the version follows the reference as it changes."""

PATCH = [
    ("    if index in state.error_dict:\n"
     "        buffer.add_(state.error_dict[index])  # what we failed to send last step\n"
     "    else:\n"
     "        state.error_dict[index] = torch.zeros_like(buffer)\n"
     "    # A buffer kept per bucket: a fresh 4.6 MiB each step costs page faults, a copy less.\n"
     "    return state.before_dict.setdefault(index, torch.empty_like(buffer)).copy_(buffer)\n",
     "    residual = state.error_dict.get(index)\n"
     "    if residual is not None:\n"
     "        buffer += residual\n"
     "    return buffer.clone()\n"),
    ("    for mat, q, p in zip(matrices, qs, ps):\n"
     "        p.copy_(torch.matmul(q.t(), mat.t()).t())\n",
     "    for i in range(len(matrices)):\n"
     "        ps[i][:] = matrices[i] @ qs[i]\n"),
    ("    for mat, p, q in zip(matrices, ps, qs):\n"
     "        orthogonalize(p, epsilon)\n",
     "    for mat, p, q in zip(matrices, ps, qs):\n"
     "        orthogonalize(p, epsilon)\n"
     "        q[:] = mat.t() @ p\n"
     "        continue\n"),
    ("    q_flat.div_(world_size)  # Q was summed over ranks: average it\n"
     "    for mat, p, q in zip(matrices, ps, qs):\n"
     "        torch.matmul(p, q.t(), out=mat)  # M ~ P Q^T, straight into the bucket\n",
     "    for mat, p, q in zip(matrices, ps, qs):\n"
     "        q /= world_size\n"
     "        mat.copy_(p @ q.t())\n"),
    ("    torch.sub(before, buffer, out=state.error_dict[index])\n",
     "    state.error_dict[index] = before - buffer\n"),
]
