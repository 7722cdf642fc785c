"""What a person reads at the end of a job: one summary line (cuts, held-out perplexity before ->
after, avg_acc / rp when evaluated, total time, where the row and the model went; an evaluate job:
what it evaluated and its scores), then the generation samples side by side when the job made
them. A skipped job shows its finished row's summary."""

from __future__ import annotations

import math

from replaceme_exp.results.row import cuts_of, decode_cell, format_cuts


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def summary_line(row: dict) -> str:
    """One line for a finished, skipped or failed job's row."""
    status = row.get("status")
    head = f"job {row.get('run_id')} {status}"
    if status == "skipped":
        head = f"job skipped: finished before as run {row.get('run_id')} (force=true reruns)"
    if status == "failed":
        where = f" in stage {row['failed_stage']}" if row.get("failed_stage") else ""
        error = (str(row.get("error") or "").splitlines() or [""])[0]
        seconds = _number(row.get("time_total_s"))
        parts = [f"{head}{where}{f' after {_duration(seconds)}' if seconds is not None else ''}: {error}"]
    else:
        parts = [head, f"cuts {format_cuts(row.get('cuts'))}"]
        before, after = _number(row.get("ppl_heldout_baseline")), _number(row.get("ppl_heldout"))
        if row.get("job") == "evaluate":
            parts[1] = f"evaluated {row.get('evaluated_checkpoint') or row.get('model')}"
            if cuts_of(row.get("cuts")):
                parts[1] += f" (cuts {format_cuts(row.get('cuts'))} of {row.get('model')})"
            if after is not None:
                parts.append(f"held-out ppl {after:.2f}")
        elif before is not None and after is not None:
            healed = _number(row.get("ppl_heldout_before_healing"))
            via = f" -> {healed:.2f} pruned, healed ({row.get('healing')})" if healed is not None else ""
            parts.append(f"held-out ppl {before:.2f}{via} -> {after:.2f} (x{after / before:.2f})")
        acc, acc_base, rp = (_number(row.get(k)) for k in ("avg_acc", "avg_acc_baseline", "rp"))
        if acc is not None:
            parts.append(f"avg_acc {acc_base:.3f} -> {acc:.3f}" if acc_base is not None else f"avg_acc {acc:.3f}")
        if rp is not None:
            parts.append(f"rp {rp:.3f}")
        parts.append(_duration(_number(row.get("time_total_s"))))
    if row.get("row_path"):
        parts.append(f"row {row['row_path']}")
    if row.get("pruned_model_path"):
        parts.append(f"model {row['pruned_model_path']}")
    elif row.get("saved_model") == "transform" and row.get("transforms_path"):
        parts.append(f"transforms {row['transforms_path']} (the checkpoint: make export RUN={row.get('config_hash')})")
    return ", ".join(parts)


def sample_lines(row: dict, width: int = 160) -> list[str]:
    """The generation samples: per prompt, the unpruned and the pruned model's answer (one line
    each, cut at ``width`` characters, newlines shown as ``⏎``)."""
    samples = decode_cell(row.get("generation_samples"))
    if samples is None or len(samples) == 0:
        return []

    def flat(text: str) -> str:
        text = " ⏎ ".join(line.strip() for line in str(text).splitlines() if line.strip())
        return text if len(text) <= width else text[: width - 1] + "…"

    if "answer" in samples[0]:  # an evaluate job: one model
        lines = ["generation samples (greedy, chat template)"]
        for sample in samples:
            lines += [f"  prompt: {flat(sample['prompt'])}", f"  answer: {flat(sample['answer'])}"]
        return lines
    lines = ["generation samples (greedy, chat template): unpruned | pruned"]
    for sample in samples:
        lines += [
            f"  prompt:   {flat(sample['prompt'])}",
            f"  unpruned: {flat(sample['unpruned'])}",
            f"  pruned:   {flat(sample['pruned'])}",
        ]
    return lines
