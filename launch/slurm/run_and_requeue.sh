# Sourced by the sbatch templates (from the repository root): SLURM's early warning becomes a checkpoint and a
# requeue, and the requeued job resumes at the saved step.
#
#   source launch/slurm/run_and_requeue.sh
#   run_or_requeue srun python main.py ... "${TRAIN_ARGS[@]}"
#
# With `#SBATCH --signal=B:USR1@120` SLURM sends SIGUSR1 to the batch shell alone (B:) about 120 s before the time
# limit (up to a minute earlier: SLURM looks once a minute); `scancel --batch --signal=USR1 JOB` asks the same by
# hand. The trap below forwards it to the training (srun forwards signals to all its tasks), which was started with
# TRAIN_ARGS: --config.preemption.signals=SIGTERM,SIGUSR1 --config.preemption.exit_code=$PREEMPTION_EXIT_CODE.
# Every process saves a checkpoint at the current step and exits with PREEMPTION_EXIT_CODE (default 143), and then:
#
#   training exits with       the batch script
#   0                         returns 0 (the template goes on)
#   PREEMPTION_EXIT_CODE      `scontrol requeue JOB` (JOB = ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} for an array
#                             task, else $SLURM_JOB_ID) and exits 0: the job did what it should (saved and arranged
#                             its continuation; its state shows REQUEUED, then PENDING), and a non-zero status would
#                             report a failure and trip slurm.conf's RequeueExit/RequeueExitHold where configured.
#                             If the requeue fails (e.g. submitted with --no-requeue) it exits with the code.
#   128 + SIGUSR1 (138)       the same, if SIGUSR1 had arrived: it reached the training before its handler was set
#                             (it resumes from its last periodic checkpoint)
#   PREEMPTION_EXIT_CODE with  the training asked to be restarted without SLURM's warning (every process exited with the
#   no SIGUSR1 (unsolicited)   code: a peer lost or stuck past cluster.collective_timeout_seconds, a signal sent to
#                             the tasks alone): a requeue, bounded as a lost worker's (below)
#   129..159, another signal  a task died of signal N = code - 128 (srun returns 137 when one task got SIGKILL: the
#   (137 = SIGKILL, ...)      OOM killer, a node's trouble, `kill -9`): a lost worker, restartable. The same requeue
#                             while this job's requeues for these two causes (counted in REQUEUE_RECORD, see below;
#                             not SLURM_RESTART_COUNT, which counts time-limit requeues too) < MAX_SIGNAL_REQUEUES
#                             (default 3); past that it exits with the code, so a task killed on every run (e.g.
#                             out of memory) does not requeue forever. It resumes from the last checkpoint.
#   anything else (1: a user  exits with that code, no requeue: rerunning would only fail again
#   error, a crash)
#
# srun returns the largest of its tasks' codes, so one task's user error (1) under the 143 of a peer that lost it
# comes back as 143: srun's own lines in the job's log ("srun: error: HOST: task 1: Exited with exit code 1", read
# from the file this shell's stderr writes to, from where this run began) decide then. A task that exited with any
# code but 0, the preemption code or 128 + a signal makes the job exit with that code, naming the task, and never
# requeue. (A log that is not a file, e.g. a terminal, is not read.)
#
# After SIGTERM (below) no code requeues.
#
# The requeued job reruns the whole script with the same environment and job id, so the same --workdir: the training
# restores the saved checkpoint ("restored <workdir>/checkpoints/ckpt-N") and goes on to the end. Keep
# `#SBATCH --open-mode=append` so the requeued run appends to the log instead of truncating it.
#
# SIGTERM to the batch shell means SLURM itself is ending the job (scancel, the time limit, or its own preemption,
# which requeues by itself under PreemptMode=REQUEUE): SLURM sends it to every process of the job, so the training
# saves and exits with the code anyway. The trap forwards it too (a second SIGTERM is harmless), keeps this shell
# alive until the save is done (a batch shell that dies takes its job steps with it) and does NOT requeue: a
# requeue would undo a scancel. The script exits with the training's code; rerun or resubmit to resume.
#
# REQUEUE_RECORD (set by the templates: <workdir>/slurm_requeues.txt; a remote workdir, gs:// etc., or none: the
# submit directory's slurm-requeues.txt) gets one line per requeue nobody asked for, "<job> <cause>": the count of
# this job's lines is the bound's, so a resubmitted job (a new id) starts again at 0 on the same workdir.
#
# Environment: PREEMPTION_EXIT_CODE (default 143), MAX_SIGNAL_REQUEUES (default 3), EXTRA_ARGS (more --config.*
# overrides appended to TRAIN_ARGS, split on spaces; e.g. EXTRA_ARGS="--config.train.steps=20000").
#
# name_after_config CONFIG KIND (before anything is printed): the job, its log and its default workdir are named
# after the config file, not the template: CONFIG=configs/digits_cnn.py with KIND mwms -> JOB_NAME=digits_cnn-mwms.
# `#SBATCH --job-name=KIND` cannot read CONFIG, so a job still called KIND (no --job-name of the submitter's) renames
# itself (`scontrol update JobName=`, kept by a requeue) and its log: slurm-KIND-<job id>.out in the submit directory
# (the template's --output) becomes slurm-JOB_NAME-<job id>.out, the same open file.

PREEMPTION_EXIT_CODE=${PREEMPTION_EXIT_CODE:-143}
if ! [[ $PREEMPTION_EXIT_CODE =~ ^[0-9]+$ ]] || (( PREEMPTION_EXIT_CODE < 2 || PREEMPTION_EXIT_CODE > 255 )); then
  echo "error: PREEMPTION_EXIT_CODE must be an exit code 2..255 (0 is success, 1 a user error), got" \
       "'$PREEMPTION_EXIT_CODE'" >&2
  exit 1
fi
MAX_SIGNAL_REQUEUES=${MAX_SIGNAL_REQUEUES:-3}
if ! [[ $MAX_SIGNAL_REQUEUES =~ ^[0-9]+$ ]]; then
  echo "error: MAX_SIGNAL_REQUEUES must be a number of requeues >= 0, got '$MAX_SIGNAL_REQUEUES'" >&2
  exit 1
fi
read -r -a _rq_extra <<< "${EXTRA_ARGS:-}"
TRAIN_ARGS=(--config.preemption.signals=SIGTERM,SIGUSR1 "--config.preemption.exit_code=$PREEMPTION_EXIT_CODE"
            ${_rq_extra[@]+"${_rq_extra[@]}"})

_rq_pid=""      # the running training (python or srun), "" between runs
_rq_warned=0    # SIGUSR1 arrived: save, exit, requeue
_rq_ending=0    # SIGTERM arrived: SLURM is ending the job; save and exit, no requeue

exec {_rq_log}>&2  # the traps write here: they may run inside the poll loop's `2>/dev/null`

_rq_forward() {  # $1: the signal, $2: what happens now
  if [ -n "$_rq_pid" ]; then
    echo "[slurm] SIG$1: $2" >&"$_rq_log"
    kill -"$1" "$_rq_pid" 2>/dev/null || true
  fi
}
trap '_rq_warned=1; _rq_forward USR1 "the training saves a checkpoint and exits, then a requeue"' USR1
trap '_rq_ending=1; _rq_forward TERM "SLURM is ending the job; the training saves and exits"' TERM

_rq_job() {  # the job as scontrol names it: ARRAYID_TASKID for an array task, else SLURM_JOB_ID ("" outside SLURM)
  if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then
    echo "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  else
    echo "${SLURM_JOB_ID:-}"
  fi
}

name_after_config() {  # $1: CONFIG (path[:arg]), $2: the template's kind, its #SBATCH --job-name; sets JOB_NAME
  local config=${1%%:*} arg=""
  [[ $1 == *:* ]] && arg="-${1#*:}"
  JOB_NAME=$(printf '%s' "$(basename "$config" .py)$arg-$2" | tr -c 'A-Za-z0-9_.-' '_')
  if [ -z "${SLURM_JOB_ID:-}" ] || [[ ${SLURM_JOB_NAME:-} != "$2" && ${SLURM_JOB_NAME:-} != "$JOB_NAME" ]]; then
    return 0  # not a SLURM job, or one the submitter named (--job-name)
  fi
  local log default renamed
  log=$(readlink "/proc/$$/fd/1" 2>/dev/null || true)
  default=$(realpath -m "${SLURM_SUBMIT_DIR:-$PWD}/slurm-$2-$SLURM_JOB_ID.out")  # as /proc names it: no symlinks
  renamed="$(dirname "$default")/slurm-$JOB_NAME-$SLURM_JOB_ID.out"
  if [ "$log" = "$default" ] && [ -e "$renamed" ]; then  # a requeue SLURM logs under the first name: append
    exec >>"$renamed" 2>&1
    exec {_rq_log}>&2
  elif [ "$log" = "$default" ]; then  # (else the submitter's --output)
    mv "$default" "$renamed" 2>/dev/null ||  # the same open file under its new name: SLURM's lines go there too
      echo "[slurm] could not rename the log $default to $renamed; it stays" >&2
  fi
  if [ "$SLURM_JOB_NAME" = "$2" ]; then  # (a requeued job keeps the new name)
    scontrol update "JobId=$(_rq_job)" "JobName=$JOB_NAME" >/dev/null 2>&1 ||
      echo "[slurm] could not rename job $(_rq_job) to $JOB_NAME (scontrol update failed)" >&2
  fi
}

# The file counting this job's requeues nobody asked for: REQUEUE_RECORD unless it is remote or unset.
_rq_record() {
  if [ -n "${REQUEUE_RECORD:-}" ] && [[ $REQUEUE_RECORD != *://* ]]; then
    echo "$REQUEUE_RECORD"
  else
    echo "${SLURM_SUBMIT_DIR:-$PWD}/slurm-requeues.txt"
  fi
}

_rq_requeue_and_exit() {  # $1: the training's exit code, $2: what happened (default: checkpoint saved)
  local job what=${2:-checkpoint saved}
  job=$(_rq_job)
  if [ -z "$job" ]; then
    echo "[slurm] not a SLURM job (no SLURM_JOB_ID): nothing to requeue; rerun the same command to resume" >&2
    exit "$1"
  fi
  if scontrol requeue "$job"; then
    echo "[slurm] $what; requeued job $job: it reruns this script and resumes at the last checkpoint" >&2
    exit 0
  fi
  echo "[slurm] $what, but \`scontrol requeue $job\` failed (submitted with --no-requeue?);" \
       "resubmit the job to resume" >&2
  exit "$1"
}

# Runs "$@" (the training) in the background and waits for it, forwarding SIGUSR1/SIGTERM. Returns its exit code;
# after a preemption it requeues and exits instead (see the table above).
run_or_requeue() {
  if (( _rq_ending )); then  # SIGTERM came between two runs: the job is ending
    exit "$PREEMPTION_EXIT_CODE"
  fi
  if (( _rq_warned )); then  # the warning came between two runs: no time for another one
    _rq_requeue_and_exit "$PREEMPTION_EXIT_CODE"
  fi
  # srun's per-task lines go to the job's log (this shell's stderr): where it is a file, read what this run adds
  local log log_start=0
  log=$(readlink "/proc/$$/fd/2" 2>/dev/null || true)
  if [ -f "$log" ]; then log_start=$(stat -c %s "$log"); else log=""; fi
  "$@" &
  _rq_pid=$!
  if (( _rq_warned )); then _rq_forward USR1 "arrived as the training started"; fi  # trapped since the check above
  if (( _rq_ending )); then _rq_forward TERM "arrived as the training started"; fi
  # Poll, and `wait` for the training only once it has ended. A `wait` that a trapped signal interrupts returns
  # 128 + that signal, and when the training ended around the trap, bash 5.2 lost its code (the next `wait` gave -1
  # in ~half of 100 tries; the same for `sleep & wait`). A foreground sleep defers the traps by <= 0.2 s instead.
  while kill -0 "$_rq_pid" 2>/dev/null; do
    { sleep 0.2; } 2>/dev/null || true  # SLURM's SIGTERM kills the sleep too: no "Terminated" line, no exit (-e)
  done
  local code=0
  wait "$_rq_pid" 2>/dev/null || code=$?
  _rq_pid=""
  local failed="" tasks failed_code
  if [ -n "$log" ]; then
    failed=$(tail -c +$(( log_start + 1 )) "$log" | _rq_failed_task) || true  # it stops at the first: SIGPIPE
  fi
  if [ -n "$failed" ] && (( code != 0 )); then
    read -r tasks failed_code <<< "$failed"
    echo "[slurm] task $tasks exited with code $failed_code (not a preemption; the job's code was $code): no" \
         "requeue, rerunning would fail again; see that task's error above" >&2
    exit "$failed_code"
  fi
  # 128 + SIGUSR1: the signal reached the training before it set up its handler; it resumes from its last checkpoint.
  if (( code == PREEMPTION_EXIT_CODE || (_rq_warned && code == 128 + $(kill -l USR1)) )); then
    if (( _rq_ending )); then
      echo "[slurm] the training exited with $code after SIGTERM; SLURM is ending this job, so no requeue here" \
           "(resubmit, or rerun the same script, to resume)" >&2
      exit "$code"
    fi
    if (( ! _rq_warned )); then  # no SIGUSR1 here: a lost or stuck peer, or a signal sent to the tasks alone
      _rq_unasked "$code" unasked_preemption "the training exited with the preemption code $code without SLURM's \
warning (a lost or stuck peer?)" "see the tasks' last lines above"
    fi
    _rq_requeue_and_exit "$code"
  fi
  if (( code > 128 && code < 160 && ! _rq_ending )); then
    local name
    name=SIG$(kill -l $(( code - 128 )) 2>/dev/null || echo "$(( code - 128 ))")
    _rq_unasked "$code" lost_worker "a task died of $name (exit code $code): a lost worker" \
        "see why it was killed (out of memory?)"
  fi
  return "$code"
}

# A requeue nobody asked for ($2: lost_worker, unasked_preemption): while this job's count of them in the record
# is < MAX_SIGNAL_REQUEUES, recorded and requeued; else the job exits with the code ($1). $3: what happened, $4: hint.
_rq_unasked() {
  local record job earlier
  record=$(_rq_record)
  job=$(_rq_job)
  if [ -z "$job" ]; then
    _rq_requeue_and_exit "$1" "$3"  # not a SLURM job: says so and exits with the code
  fi
  earlier=$(grep -c "^$job " "$record" 2>/dev/null || true)
  earlier=${earlier:-0}
  if (( earlier < MAX_SIGNAL_REQUEUES )); then
    mkdir -p "$(dirname "$record")" && echo "$job $2" >> "$record" ||
      echo "[slurm] could not write $record: this requeue is not counted" >&2
    _rq_requeue_and_exit "$1" "$3, requeue $(( earlier + 1 )) of at most $MAX_SIGNAL_REQUEUES (MAX_SIGNAL_REQUEUES)"
  fi
  echo "[slurm] $3, and this job was requeued $earlier times for a lost worker or an unasked preemption code" \
       "(MAX_SIGNAL_REQUEUES=$MAX_SIGNAL_REQUEUES, counted in $record): no more requeues; $4" >&2
  exit "$1"
}

# "TASKS CODE" of the first task srun reports (on stdin) as exited with a code that is neither 0, the preemption code
# nor a death by signal (srun's line: "srun: error: HOST: task 1: Exited with exit code 1"; "tasks 0-1" when
# several); nothing otherwise.
_rq_failed_task() {
  local line tasks code
  while IFS= read -r line; do
    if [[ $line =~ ^srun:\ error:\ [^:]+:\ tasks?\ ([0-9,-]+):\ Exited\ with\ exit\ code\ ([0-9]+)$ ]]; then
      tasks=${BASH_REMATCH[1]} code=${BASH_REMATCH[2]}
      if (( code != 0 && code != PREEMPTION_EXIT_CODE && (code <= 128 || code >= 160) )); then
        echo "$tasks $code"
        return
      fi
    fi
  done < <(grep -a '^srun: error: ' || true)
}
