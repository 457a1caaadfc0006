"""A sweep's table: each trial's status (from its workdir) and DIR/report.csv + DIR/report.md, sorted by
checkpoint.best_metric in its direction (checkpoint.best_mode, read from the trials' config.json).

Reads what the runs write: summary.json (written last: the run is complete when its step reached total_steps or it
stopped early), best/best.json (the best value and its step), checkpoints/checkpoint (the last saved step), and the
sweep's own record of each attempt, DIR/<trial>/sweep.json. Pure Python; the sweep directory is a local path.
"""

import csv
import io
import json
import os
import re

# DIR/<trial>/sweep.json: {"attempts": [{"started", "pid", "command", "cores", "gpus", "exit_code", "seconds",
# "preempted" (exited with the run's preemption.exit_code: a checkpoint saved), "error" (a failure's line)}]}
ATTEMPTS = "sweep.json"
PREEMPTED = 143  # what the sweep returns for "unfinished: rerun to resume"


def read_json(path):
  """The file's JSON value, or None when it is missing or torn."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def write_json(path, value):
  """Writes atomically (a temporary file renamed)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(value, f, indent=1)
  os.replace(path + ".tmp", path)


def is_complete(workdir):
  """summary.json says the run trained to its end (or stopped early on purpose)."""
  summary = read_json(os.path.join(workdir, "summary.json"))
  return bool(summary) and ("stopped_early" in summary or summary.get("step", -1) >= summary.get("total_steps", 0))


def _alive(pid):
  try:
    os.kill(pid, 0)
  except (OSError, TypeError):
    return False
  return True


def _last_checkpoint_step(workdir):
  record = os.path.join(workdir, "checkpoints", "checkpoint")
  try:
    with open(record) as f:
      found = re.search(r'^model_checkpoint_path:\s*"?.*?ckpt-(\d+)"?\s*$', f.read(), re.M)
  except OSError:
    return None
  return int(found.group(1)) if found else None


def trial_status(workdir):
  """{'status', 'error', 'step', 'best', 'best_step', 'wall_seconds'} of one trial's workdir."""
  attempts = (read_json(os.path.join(workdir, ATTEMPTS)) or {}).get("attempts", [])
  summary = read_json(os.path.join(workdir, "summary.json")) or {}
  best = read_json(os.path.join(workdir, "best", "best.json")) or {}
  last = attempts[-1] if attempts else {}
  error = ""
  if is_complete(workdir):
    status = "complete"
  elif last and last.get("exit_code") is None and _alive(last.get("pid")):
    status = "running"
  elif last.get("exit_code") not in (None, 0) and not last.get("preempted"):
    status, error = "failed", last.get("error", "")
  else:
    status = "unfinished"
  step = summary.get("step") if status == "complete" else _last_checkpoint_step(workdir)
  return {"status": status, "error": error, "step": step, "best": best.get("value"), "best_step": best.get("step"),
          "wall_seconds": round(sum(a.get("seconds") or 0 for a in attempts), 1)}


def metric_of(sweep_dir, trials):
  """(checkpoint.best_metric, best_mode) from the first trial's config.json; ('eval/accuracy', 'max') if none ran."""
  for trial in trials:
    config = read_json(os.path.join(sweep_dir, trial["name"], "config.json")) or {}
    checkpoint = config.get("checkpoint") or {}
    if checkpoint.get("best_metric"):
      return checkpoint["best_metric"], checkpoint.get("best_mode", "max")
  return "eval/accuracy", "max"


def rows(sweep_dir, trials):
  """One dict per trial, best first (trials without a value last, in trial order)."""
  metric, mode = metric_of(sweep_dir, trials)
  table = []
  for trial in trials:
    status = trial_status(os.path.join(sweep_dir, trial["name"]))
    table.append({"trial": trial["name"], **trial["overrides"], f"best {metric}": status["best"],
                  "best_step": status["best_step"], "step": status["step"], "wall_seconds": status["wall_seconds"],
                  "status": status["status"], "error": status["error"], "_index": trial["index"]})
  sign = -1 if mode == "max" else 1
  best = f"best {metric}"
  table.sort(key=lambda r: (r[best] is None, 0 if r[best] is None else sign * r[best], r["_index"]))
  for row in table:
    del row["_index"]
  return table


def write(sweep_dir, trials):
  """Writes DIR/report.csv and DIR/report.md; returns the Markdown table."""
  table = rows(sweep_dir, trials)
  columns = list(table[0]) if table else ["trial"]
  text = io.StringIO()
  writer = csv.DictWriter(text, columns, lineterminator="\n")
  writer.writeheader()
  writer.writerows(table)
  _write_text(os.path.join(sweep_dir, "report.csv"), text.getvalue())
  markdown = _markdown(table, columns)
  _write_text(os.path.join(sweep_dir, "report.md"), markdown)
  return markdown


def _cell(value):
  if value is None:
    return ""
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value).replace("|", "\\|")


def _markdown(table, columns):
  lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
  lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in table]
  return "\n".join(lines) + "\n"


def _write_text(path, text):
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)
