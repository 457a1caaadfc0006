"""A sweep's table: each trial's status (from its workdir) and DIR/report.csv + DIR/report.md, sorted by
checkpoint.best_metric in its direction (checkpoint.best_mode, read from the trials' config.json).

Reads what the runs write: summary.json (written last: the run is complete when its step reached total_steps or it
stopped early), best/best.json (the best value and its step), checkpoints/checkpoint (the last saved step:
`last_saved_step`), and the sweep's own record of each attempt, DIR/<trial>/sweep.json, and the run's starts
(starts.jsonl) - each trial by what ran its current settings only (an earlier sweep's flags say nothing about it).
Pure Python; the sweep directory is a local path.
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


def is_complete(workdir, settings=None):
  """summary.json says the run trained to its end (or stopped early on purpose: early stopping, pruned), and, given
  the trial's `settings` fingerprint, that it ran these settings (the summary's `sweep_settings`)."""
  summary = read_json(os.path.join(workdir, "summary.json"))
  if not summary or (settings and summary.get("sweep_settings") != settings):
    return False
  return "stopped_early" in summary or summary.get("step", -1) >= summary.get("total_steps", 0)


def pruned(summary):
  """"pruned at step S (value V)" when the study's pruner stopped the run, else None."""
  reason = str(summary.get("stopped_early") or "")
  return reason if reason.startswith("pruned at") else None


def alive(pid):
  """Process `pid` exists (a zombie too: the caller reaps its own children)."""
  try:
    os.kill(pid, 0)
  except (OSError, TypeError):
    return False
  return True


def last_saved_step(workdir):
  """The step of the run's latest complete checkpoint (where a rerun resumes), from its index's text, or None.

  The index (workdir/checkpoints/checkpoint, a text CheckpointState that TensorFlow renames into place once a
  checkpoint is whole) is the one record naming that step: a preempted or killed run writes no summary.json and
  starts.jsonl holds only where each start began. This pure-Python launcher cannot ask the checkpoints' owner
  (loops/persist/checkpoints.py), so it reads the one field; the only reader of checkpoint text outside the owner
  (tests/test_checkpoint_readers.py declares it and holds it to an index TensorFlow wrote).
  """
  record = os.path.join(workdir, "checkpoints", "checkpoint")
  try:
    with open(record) as f:
      found = re.search(r'^model_checkpoint_path:\s*"?.*?ckpt-(\d+)"?\s*$', f.read(), re.M)
  except OSError:
    return None
  return int(found.group(1)) if found else None


def current_attempts(workdir, settings):
  """The sweep's attempts of the trial that ran `settings` (their command's --config.sweep.settings; all without)."""
  attempts = (read_json(os.path.join(workdir, ATTEMPTS)) or {}).get("attempts", [])
  flag = f"--config.sweep.settings={settings}"
  return [a for a in attempts if not settings or flag in (a.get("command") or [])]


def current_starts(workdir, settings):
  """The run's starts (starts.jsonl: step, plan, config) since it last started with other settings than `settings`
  (config.sweep.settings; every start without)."""
  try:
    with open(os.path.join(workdir, "starts.jsonl")) as f:
      lines = f.read().splitlines()
  except OSError:
    return []
  starts = []
  for line in reversed(lines):
    try:
      start = json.loads(line)
    except ValueError:
      continue
    if settings and ((start.get("config") or {}).get("sweep") or {}).get("settings") != settings:
      break
    starts.insert(0, start)
  return starts


STATUSES = ("complete", "pruned", "running", "unfinished", "failed", "pending")  # what trial_status says


def trial_status(workdir, settings=None):
  """{'status', 'error', 'stopped', 'step', 'from_step', 'total_steps', 'best', 'best_step', 'wall_seconds'} of one
  trial's workdir, from what ran its current `settings` only; status: complete, pruned, running, failed,
  unfinished, or pending (not started with these settings: an earlier sweep's record says nothing about them)."""
  attempts, starts = current_attempts(workdir, settings), current_starts(workdir, settings)
  summary = read_json(os.path.join(workdir, "summary.json")) or {}
  if settings and summary.get("sweep_settings") != settings:
    summary = {}
  last, error = (attempts[-1] if attempts else {}), ""
  if is_complete(workdir, settings):
    status = "pruned" if pruned(summary) else "complete"
  elif last and last.get("exit_code") is None and alive(last.get("pid")):
    status = "running"
  elif last.get("exit_code") not in (None, 0) and not last.get("preempted"):
    status, error = "failed", last.get("error", "")
  else:
    status = "unfinished" if attempts or starts else "pending"
  ended = status in ("complete", "pruned")
  best = (read_json(os.path.join(workdir, "best", "best.json")) or {}) if attempts or starts else {}
  total = summary.get("total_steps") or ((starts[-1].get("plan") or {}).get("total_steps") if starts else None)
  return {"status": status, "error": error, "stopped": summary.get("stopped_early", "") if ended else "",
          "step": summary.get("step") if ended else last_saved_step(workdir) if starts else None,
          "from_step": starts[0].get("step", 0) if starts else 0, "total_steps": total,
          "best": best.get("value"), "best_step": best.get("step"),
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
    status = trial_status(os.path.join(sweep_dir, trial["name"]), trial.get("settings"))
    table.append({"trial": trial["name"], **trial["overrides"], f"best {metric}": status["best"],
                  "best_step": status["best_step"], "step": status["step"], "wall_seconds": status["wall_seconds"],
                  "status": status["status"], "stopped": status["stopped"], "error": status["error"],
                  "_index": trial["index"], "_total_steps": status["total_steps"], "_from_step": status["from_step"]})
  sign = -1 if mode == "max" else 1
  best = f"best {metric}"
  table.sort(key=lambda r: (r[best] is None, 0 if r[best] is None else sign * r[best], r["_index"]))
  return table


def steps_spent(table, unasked=0):
  """(steps trained with the current settings: from each trial's first start with them to the step it reached,
  the steps every trial trains with them at its full length: from that start to its own length; 0 while no trial
  has started with them): what pruning saved. A trial's length is its own (a batch size or epochs in the grid
  changes it); one not started yet, or not asked yet of the study (`unasked` of them), counts as the longest
  started, from step 0."""
  longest = max((row["_total_steps"] or 0 for row in table), default=0)
  full = sum(max(0, (row["_total_steps"] or longest) - row["_from_step"]) for row in table) if longest else 0
  full += unasked * longest
  return sum(max(0, (row["step"] or 0) - row["_from_step"]) for row in table), full


def best_curve(table, mode):
  """The best value found after 1, 2, ... trials (in trial order; None until a trial has one)."""
  best, curve = None, []
  for row in sorted(table, key=lambda r: r["_index"]):
    value = row[next(k for k in row if k.startswith("best ") and k != "best_step")]
    if value is not None:
      best = value if best is None else (max if mode == "max" else min)(best, value)
    curve.append(best)
  return curve


def plot(path, curve, metric):
  """A PNG of the best value against trials spent."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  import matplotlib.ticker  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

  figure, axes = pyplot.subplots(figsize=(6, 4))
  points = [(i + 1, v) for i, v in enumerate(curve) if v is not None]
  axes.step([p[0] for p in points], [p[1] for p in points], where="post", marker="o")
  axes.set_xlabel("trials spent")
  axes.set_ylabel(f"best {metric}")
  axes.set_xlim(0.5, max(1, len(curve)) + 0.5)
  axes.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
  axes.grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(path + ".tmp.png", dpi=100)
  pyplot.close(figure)
  os.replace(path + ".tmp.png", path)


def write(sweep_dir, trials, count=None):
  """Writes DIR/report.csv, DIR/report.md and DIR/best_by_trial.png; returns the Markdown table and its steps
  line. count: the trials the sweep runs (a tpe sweep's study is asked them one by one; default: `trials`)."""
  table = rows(sweep_dir, trials)
  metric, mode = metric_of(sweep_dir, trials)
  unasked = max(0, (count or len(table)) - len(table))
  spent, full = steps_spent(table, unasked)
  plot(os.path.join(sweep_dir, "best_by_trial.png"), best_curve(table, mode), metric)
  for row in table:
    del row["_index"], row["_total_steps"], row["_from_step"]
  columns = list(table[0]) if table else ["trial"]
  text = io.StringIO()
  writer = csv.DictWriter(text, columns, lineterminator="\n")
  writer.writeheader()
  writer.writerows(table)
  _write_text(os.path.join(sweep_dir, "report.csv"), text.getvalue())
  states = [row["status"] for row in table]
  counts = ", ".join(f"{states.count(s)} {s}" for s in STATUSES if s in states)  # one order, whatever ranks first
  if unasked:
    counts += f", {unasked} not asked yet"
  trials_line = f"{len(table) + unasked} trials: {counts}"
  of = f" of {full} for {len(table) + unasked} full-length trials ({100 * spent / full:.0f} %)" if full else ""
  markdown = _markdown(table, columns) + f"\n{trials_line}; steps spent {spent}{of}\n"
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
