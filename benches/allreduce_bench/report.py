"""What a run prints and writes: the table, the notes and the JSON document (rank 0)."""

import json
import os
import sys

from .common import log
from .rules import operation


def shape_text(row):
    """A row's shape column: rows x width, tokens x hidden, or nothing (the all-reduce)."""
    if "rows" in row:
        return f"{row['rows']}x{row['width']}"
    if "tokens" in row:
        return f"{row['tokens']}x{row['hidden']}"
    return None


def what_is_timed(args):
    """What one timed operation is, for the notes."""
    if getattr(args, "epilogue", False):
        return ("call (tokens x hidden: the all-reduce, residual add and RMSNorm; decode rows: "
                "per step of 61 x 2 calls)")
    if getattr(args, "sequence_parallel", False):
        return "step (tokens x hidden: the partial sum to its RMSNorm on every rank)"
    return operation(getattr(args, "collective", "all_reduce"))


class Report:
    """The output half of `Bench`: rows, notes and the header it gathered."""

    def table_line(self, row):
        def number(value, width, digits):
            return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"

        if row["exact"] is None:
            exact = "-"
        else:
            exact = "yes" if row["exact"] else "NO"
        shape = shape_text(row)
        return (
            f"{row['bytes']:>11}  {'' if shape is None else f'{shape:>12}  '}"
            f"{row['contender']:<26}"
            f"{number(row['median_us'], 10, 2)}{number(row['min_us'], 10, 2)}"
            f"{number(row['max_us'], 10, 2)}{number(row['bus_gbps'], 9, 1)}  {exact}"
        )

    def print_rows(self, rows):
        if self.rank != 0:
            return
        if not self.printed_header:
            shape = "" if not rows or shape_text(rows[0]) is None else f"{'shape':>12}  "
            print(
                f"{'bytes':>11}  {shape}{'contender':<26}{'median_us':>10}{'min_us':>10}"
                f"{'max_us':>10}{'busbw':>9}  exact"
            )
            self.printed_header = True
        for row in rows:
            print(self.table_line(row))
        sys.stdout.flush()

    def print_notes(self):
        if self.rank != 0:
            return
        errors = [row for row in self.rows if row["error"]]
        print()
        print(
            f"times: microseconds per {what_is_timed(self.args)} (median, fastest and "
            "slowest round);"
        )
        print("busbw: GB/s at the median; exact: bit-exact against the fp32 rank-order sum")
        for row in errors:
            print(f"unavailable: {row['bytes']} {row['contender']}: {row['error']}")
        for note in self.notes:
            print(f"note: {note}")
        sys.stdout.flush()

    def document(self, complete, failure=None):
        doc = dict(self.header)
        doc["rows"] = list(self.rows)
        doc["complete"] = complete
        if failure is not None:
            doc["failure"] = failure
        if self.notes:
            doc["notes"] = list(self.notes)
        return doc

    def write_json(self, complete, failure=None):
        if self.rank != 0 or not self.args.json:
            return
        path = self.args.json
        temporary = f"{path}.tmp{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(self.document(complete, failure), handle, indent=2)
            handle.write("\n")
        os.replace(temporary, path)
        log(self.rank, f"wrote {path}")
