"""The timing method: inputs and the reference, CUDA-graph capture, interleaved rounds with a
barrier before every sample, calibration, the exactness check and one size's rows, for the
all-reduce, the reduce-scatter and the all-gather."""

import math
import statistics

from .common import Fatal, describe, format_bytes
from .rules import ROW_COLLECTIVES, bench_shape, bus_factor, owned_rows

CALIBRATION_ROUNDS = 3


class Timing:
    """The measuring half of `Bench`; it uses the run's collective helpers."""

    # -- data ---------------------------------------------------------------------------------

    def random_input(self, elements, seed):
        torch = self.torch
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        lo, hi = self.exponents
        shape = (elements,)
        exponent = torch.randint(
            lo, hi + 1, shape, generator=generator, device=self.device, dtype=torch.int32
        )
        mantissa = torch.randint(
            0, 128, shape, generator=generator, device=self.device, dtype=torch.int32
        )
        negative = torch.randint(
            0, 2, shape, generator=generator, device=self.device, dtype=torch.int32
        )
        magnitude = ((exponent << 7) | mantissa).to(torch.int16).view(torch.bfloat16)
        return torch.where(negative.bool(), -magnitude, magnitude).contiguous()

    def reference(self, pristine):
        """fp32 sum in rank order from rank 0's value, rounded once to bf16 (nearest even)."""
        torch = self.torch
        gathered = [torch.empty_like(pristine) for _ in range(self.world)]
        self.dist.all_gather(gathered, pristine)
        total = gathered[0].float()
        for part in gathered[1:]:
            total.add_(part.float())
        reference = total.to(torch.bfloat16)
        torch.cuda.synchronize()
        return reference

    @staticmethod
    def input_seed(size_index, rank):
        return 0x5EED0000 + 7919 * size_index + 104729 * rank

    def row_reference(self, shape, size_index):
        """This rank's expected output of a row collective of `shape`, from every rank's input
        made again here from its seed: the reduce-scatter's rows of the fp32 rank-order sum
        rounded once, the all-gather's every rank's rows in rank order."""
        torch = self.torch
        rows, width = shape
        if self.args.collective == "reduce_scatter":
            total = None
            for rank in range(self.world):
                part = self.random_input(rows * width, self.input_seed(size_index, rank)).float()
                total = part if total is None else total.add_(part)
            mine = owned_rows(rows, self.world, self.rank)
            reference = total.to(torch.bfloat16)[mine.start * width : mine.stop * width]
        else:
            parts = [
                self.random_input(
                    len(owned_rows(rows, self.world, rank)) * width,
                    self.input_seed(size_index, rank),
                )
                for rank in range(self.world)
            ]
            reference = torch.cat(parts)
        torch.cuda.synchronize()
        return reference.contiguous()

    def message(self, nbytes):
        """(bytes timed, what `bind` takes, this rank's input elements, the row's shape fields)
        of a size: the all-reduce's elements, a row collective's rows x width
        (`rules.bench_shape`)."""
        if self.args.collective not in ROW_COLLECTIVES:
            return nbytes, nbytes // 2, nbytes // 2, {}
        rows, width = bench_shape(nbytes, 2, self.world)
        owned = len(owned_rows(rows, self.world, self.rank))
        elements = rows * width if self.args.collective == "reduce_scatter" else owned * width
        return rows * width * 2, (rows, width), elements, {"rows": rows, "width": width}

    # -- graphs and timing --------------------------------------------------------------------

    def capture(self, contender, ops):
        torch = self.torch
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(ops):
                contender.op()
        torch.cuda.synchronize()
        return graph

    def round(self, contenders, pristine, use_single):
        """One interleaved round: per contender reset, barrier, pause, event, replay, event.

        Returns microseconds per replay, in `contenders` order.
        """
        torch = self.torch
        events = []
        for contender in contenders:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            graph = contender.single if use_single else contender.graph
            contender.reset(pristine)
            self.barrier()
            self.pause()
            start.record()
            graph.replay()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1000.0 for start, end in events]

    def calibrate(self, contenders, pristine):
        """Operations per replay, from the slowest rank's best one-op replay."""
        torch = self.torch
        best = [math.inf] * len(contenders)
        for index in range(CALIBRATION_ROUNDS):
            self.kick(f"calibration round {index + 1}")
            for slot, value in enumerate(self.round(contenders, pristine, use_single=True)):
                if math.isfinite(value) and value > 0:
                    best[slot] = min(best[slot], value)
        estimate = torch.tensor(
            [value if math.isfinite(value) else 1e9 for value in best],
            dtype=torch.float64,
            device=self.device,
        )
        self.dist.all_reduce(estimate, op=self.dist.ReduceOp.MAX)
        ops = []
        for value in estimate.tolist():
            wanted = math.ceil(self.args.sample_us / max(value, 0.1))
            ops.append(max(1, min(self.args.max_ops, wanted)))
        return ops

    def check_exact(self, contender, pristine, reference):
        """Mismatched elements of one captured op against the reference, on this rank."""
        torch = self.torch
        contender.reset(pristine)
        self.barrier()
        contender.single.replay()
        torch.cuda.synchronize()
        result = contender.result()
        mismatched = (result.view(torch.int16) != reference.view(torch.int16)).sum().item()
        return int(mismatched)

    # -- one size -----------------------------------------------------------------------------

    def error_row(self, nbytes, contender, error):
        return {
            **getattr(self, "row_shape", {}),
            "bytes": nbytes,
            "contender": contender.name,
            "median_us": None,
            "min_us": None,
            "max_us": None,
            "rounds": 0,
            "ops_per_sample": 0,
            "bus_gbps": None,
            "exact": None,
            "error": error,
        }

    def bench_size(self, nbytes, contenders, size_index):
        torch = self.torch
        nbytes, bound, elements, self.row_shape = self.message(nbytes)
        label = format_bytes(nbytes)
        rows = {}
        exact = {}

        # Local steps and collective steps are agreed on separately, so that a rank that failed
        # locally never leaves its peers inside a collective it did not join.
        self.kick(f"{label}: inputs")
        state = {}

        def make_input():
            seed = self.input_seed(size_index, self.rank)
            state["pristine"] = self.random_input(elements, seed)
            torch.cuda.synchronize()

        def make_reference():
            if self.row_shape:
                state["reference"] = self.row_reference(bound, size_index)
            else:
                state["reference"] = self.reference(state["pristine"])

        error = self.agreed_error(self.attempt(make_input))
        if error is None:
            self.kick(f"{label}: reference sum")
            error = self.agreed_error(self.attempt(make_reference))
        if error is not None:
            for contender in contenders:
                rows[contender.name] = self.error_row(
                    nbytes, contender, contender.error or f"inputs: {error}"
                )
            return [rows[c.name] for c in contenders]
        return self.time_contenders(nbytes, bound, contenders, state["pristine"],
                                    state["reference"], rows)

    def time_contenders(self, nbytes, bound, contenders, pristine, reference, rows=None,
                        fixed_ops=None, check=None, note=None):
        """Every contender bound to `bound`, checked against `reference` and timed against
        the others on `pristine`: one row each, in `contenders` order. `check(contender,
        pristine, reference)` counts a contender's differing elements on this rank (a number,
        or one per output; `check_exact` by default) and `note(label, name, counts)` words a
        mismatch; no check without a reference. With `fixed_ops` every replay holds that many
        ops (no calibration)."""
        check = self.check_exact if check is None else check
        torch = self.torch
        label = format_bytes(nbytes)
        rows = {} if rows is None else rows
        exact = {}
        live = []
        for contender in contenders:
            if contender.error is not None:
                rows[contender.name] = self.error_row(nbytes, contender, contender.error)
                continue
            name = contender.name

            def prepare(c=contender):
                c.bind(bound)
                c.reset(pristine)
                torch.cuda.synchronize()

            def warm_up(c=contender):
                self.barrier()
                c.op()
                torch.cuda.synchronize()

            self.kick(f"{label}: {name} input")
            error = self.agreed_error(self.attempt(prepare))
            if error is not None:
                rows[name] = self.error_row(nbytes, contender, f"input: {error}")
                continue
            self.kick(f"{label}: {name} eager op")
            error = self.agreed_error(self.attempt(warm_up))
            if error is not None:
                rows[name] = self.error_row(nbytes, contender, f"eager op: {error}")
                continue

            def capture_single(c=contender):
                c.single = self.capture(c, 1)

            self.kick(f"{label}: {name} one-op capture")
            error = self.agreed_error(self.attempt(capture_single))
            if error is not None:
                contender.drop_graphs()
                rows[name] = self.error_row(nbytes, contender, f"graph capture: {error}")
                continue

            if reference is None:
                live.append(contender)
                continue
            self.kick(f"{label}: {name} exactness check")
            try:
                local = (check(contender, pristine, reference), None)
            except Exception as exc:
                local = (None, describe(exc))
            outcome = self.agree(local)
            failures = [(r, e) for r, (_, e) in enumerate(outcome) if e is not None]
            if failures:
                contender.drop_graphs()
                text = "; ".join(f"rank {r}: {e}" for r, e in failures)
                rows[name] = self.error_row(nbytes, contender, f"exactness check: {text}")
                continue
            mismatched = [count for count, _ in outcome]
            contender.mismatched = mismatched
            exact[name] = all(
                (count if isinstance(count, int) else sum(count)) == 0 for count in mismatched
            )
            if not exact[name]:
                self.notes.append(
                    note(label, name, mismatched) if note is not None else
                    f"{label} {name}: not bit-exact against the fp32 rank-order reference "
                    f"(mismatched elements per rank: {mismatched})"
                )
            live.append(contender)

        if live:
            try:
                ops = ([fixed_ops] * len(live) if fixed_ops is not None
                       else self.calibrate(live, pristine))
            except Exception as exc:
                raise Fatal(f"{label}: calibration: {describe(exc)}") from exc
            timed = []
            for contender, count in zip(live, ops, strict=True):
                name = contender.name

                def capture_many(c=contender, n=count):
                    c.graph = self.capture(c, n)
                    c.ops = n

                self.kick(f"{label}: {name} capture of {count} ops")
                error = self.agreed_error(self.attempt(capture_many))
                contender.single = None
                if error is not None:
                    contender.drop_graphs()
                    rows[name] = self.error_row(nbytes, contender, f"graph capture: {error}")
                    continue
                timed.append(contender)
            torch.cuda.synchronize()

            if timed:
                for row in self.time_rounds(nbytes, timed, pristine, exact):
                    rows[row["contender"]] = row
            for contender in live:
                contender.drop_graphs()
            torch.cuda.synchronize()

        return [rows[c.name] for c in contenders]

    def time_rounds(self, nbytes, timed, pristine, exact):
        torch = self.torch
        label = format_bytes(nbytes)
        rounds = self.args.rounds
        local = [[math.nan] * rounds for _ in timed]
        try:
            for index in range(self.args.warmup + rounds):
                self.kick(f"{label}: timing round {index + 1}")
                times = self.round(timed, pristine, use_single=False)
                if index < self.args.warmup:
                    continue
                for slot, (contender, value) in enumerate(zip(timed, times, strict=True)):
                    local[slot][index - self.args.warmup] = value / contender.ops
            self.kick(f"{label}: gathering timings")
            mine = torch.tensor(local, dtype=torch.float64, device=self.device)
            gathered = [torch.empty_like(mine) for _ in range(self.world)]
            self.dist.all_gather(gathered, mine)
            everyone = [tensor.tolist() for tensor in gathered]
        except Exception as exc:
            raise Fatal(f"{label}: timing: {describe(exc)}") from exc

        rows = []
        for slot, contender in enumerate(timed):
            per_round = []
            for index in range(rounds):
                values = [everyone[rank][slot][index] for rank in range(self.world)]
                if all(math.isfinite(value) and value > 0 for value in values):
                    per_round.append(max(values))
            row = {
                **self.row_shape,
                "bytes": nbytes,
                "contender": contender.name,
                "median_us": None,
                "min_us": None,
                "max_us": None,
                "rounds": len(per_round),
                "ops_per_sample": contender.ops,
                "bus_gbps": None,
                "exact": exact.get(contender.name),
                "error": None,
            }
            if per_round:
                median = statistics.median(per_round)
                row["median_us"] = median
                row["min_us"] = min(per_round)
                row["max_us"] = max(per_round)
                factor = bus_factor(self.args.collective, self.world)
                row["bus_gbps"] = nbytes * factor / (median * 1e-6) / 1e9
            else:
                row["error"] = "no round had a valid sample from every rank"
            rows.append(row)
        return rows
