"""What a kind of pipeline stage costs whatever the ZeRO stage, the parameter-gather
overlap and the data-parallel traffic: its chunks' forward, backward and weight-gradient
seconds, model FLOPs and parameters, priced once for every layout of a family that shares
them (:class:`StageKinds`, the base of :class:`~llmsim.search.estimate.Estimator`)."""

from __future__ import annotations

from llmsim.costs import HardwareCosts
from llmsim.schedules import placement
from llmsim.search.parts import Parts, SharedParts
from llmsim.specs import Scenario
from llmsim.workload import Chunk


class StageKinds(SharedParts):
    """The per-kind passes of a layout's stages, memoised on exactly what they read."""

    def _kind_passes(self, sc: Scenario, plan_key: tuple, costs: HardwareCosts, parts: Parts,
                     split: list[list[int]], starts: list[list[int]], node_of: list[int],
                     m: int, a: int) -> dict[tuple, tuple]:
        """Per kind of stage (:meth:`_runs`), what its passes cost whatever the ZeRO stage,
        the parameter-gather overlap and the data-parallel traffic: (forward, backward,
        weight-gradient and its first micro-batch's seconds, model FLOPs, tensors,
        parameters and expert parameters of a device, per chunk its (backward, weight)
        and forward seconds, its first chunk, and per run of equal chunks (chunk, count,
        F, B, W, accumulation seconds)); memoised for the layouts of a family (those that
        differ in what this does not read: :data:`KIND_MEMO`). Consecutive chunks of the
        same layers cost the same: priced once, their sums still added chunk by chunk
        (the same floating-point sums); the chunks of one layout are shared by its kinds
        in their order (the first kind's chunk stands for an equal one of a later kind)."""
        par = sc.parallelism
        key = (id(parts), plan_key, par.grad_reduce_dtype, par.expert_ranks, par.etp,
               id(split), id(starts), par.schedule, par.pp, par.virtual_stages, m, a)
        hit = self._kinds.get(key)
        if hit is not None:
            return hit
        p, v = par.pp, par.virtual_stages
        ef, eb, ew = parts.embedding
        hf, hb, hw = parts.head
        df_, dr, db, dw = parts.dense
        mf, mr, mb, mw = parts.moe
        fl_dense, fl_moe, fl_emb, fl_head = parts.model_flops
        same_chunks: dict[tuple, tuple] = {}  # chunks with the same layers cost the same
        hit = {}
        for s, kind_key, _, _ in self._runs(plan_key, split, node_of):
            if kind_key in hit:
                continue
            f = b = w = w_first = flops = 0.0
            backward: list[tuple[float, float]] = []
            forward: list[float] = []
            groups: list[tuple] = []
            tensors_s = params_s = experts_s = 0
            chunk_0 = None
            for c, repeat, vs, n, first, last, start in self._chunk_groups(
                    split, starts, par.schedule, p, v, s):
                chunk_key = (n, first, last, start)
                priced = same_chunks.get(chunk_key)
                if priced is None:
                    params, experts, tensors, k = self._chunk_params(sc, n, first, last, start)
                    amax_f, amax_b, acc = self._chunk_extras(sc, plan_key, costs, n, first,
                                                             last, start)
                    cf = first * ef + (n - k) * df_ + k * mf + amax_f + last * hf
                    if parts.batch_input_on_every_chunk or first or last:
                        cf += parts.batch_input
                    cb = last * hb + (n - k) * (dr + db) + k * (mr + mb) + amax_b + first * eb
                    cw = last * hw + (n - k) * dw + k * mw + first * ew
                    if parts.queued is not None:  # the host binds: each pass one queue
                        cf, cb, cw = self._chunk_queue(sc, plan_key, costs, parts, n, first,
                                                       last, start)
                    chunk_flops = ((n - k) * fl_dense + k * fl_moe + first * fl_emb
                                   + last * fl_head) * par.tp
                    chunk = Chunk(s, c, vs, n, first, last, params, (), (), (),
                                  expert_params=experts)
                    priced = same_chunks[chunk_key] = (cf, cb, cw, acc, chunk_flops, tensors,
                                                       chunk)
                cf, cb, cw, acc, chunk_flops, tensors, chunk = priced
                if c == 0:
                    chunk_0 = chunk  # only its parameters are read
                for _ in range(repeat):
                    f, b, w, w_first = f + cf, b + cb, w + cw + acc, w_first + cw
                    flops += chunk_flops
                tensors_s += tensors * repeat
                params_s += chunk.params * repeat
                experts_s += chunk.expert_params * repeat
                backward += [(cb, cw + acc)] * repeat
                forward += [cf] * repeat
                groups.append((chunk, repeat, cf, cb, cw, acc))
            hit[kind_key] = (f, b, w, w_first, flops, tensors_s, params_s, experts_s,
                             backward, forward, chunk_0, groups)
        return self._kinds.put(key, hit)

    def _chunk_groups(self, split: list[list[int]], starts: list[list[int]], schedule: str,
                      p: int, v: int, s: int) -> list[tuple[int, int, int, int, bool, bool,
                                                           int]]:
        """Stage ``s``'s chunks as runs of consecutive ones of the same layers, memoised
        (``split`` and ``starts`` are memoised objects: their ids key them): (first
        chunk, chunks in the run, its virtual stage, layers, whether it is the first or
        the last virtual stage, its first layer)."""
        key = (id(split), id(starts), schedule, p, v, s)
        hit = self._groups.get(key)
        if hit is None:
            virtual = {hop: k for k, hop in enumerate(placement(schedule, p, v))}
            hit = []
            for c in range(v):
                vs, n = virtual.get((s, c), c * p + s), split[s][c]
                shape = (n, vs == 0, vs == p * v - 1, starts[s][c])
                if hit and hit[-1][3:] == shape:
                    c0, repeat, vs0 = hit[-1][:3]
                    hit[-1] = (c0, repeat + 1, vs0, *shape)
                else:
                    hit.append((c, 1, vs, *shape))
            self._groups[key] = hit
        return hit
