"""Defaults shared by every config; variants import this file and override a few fields.

Not a runnable experiment on its own (it trains nothing useful); see configs/digits_cnn.py. Each key's comment is its
meaning in the reference, docs/configuration.md, which `python -m configs.base` writes.
"""

import re
import sys

import ml_collections
from ml_collections import config_dict


# Settings a resume may change as they are, since they leave the optimisation and the data order as they were
# (prefixes end with "."; loops/persist/starts.py). Every other key, a new one included, is a change of the
# optimisation that a resume refuses unless resume.accept_changes: the safe side. A new key that changes neither
# joins this list.
RESUMABLE = (
    "train.steps", "train.epochs", "train.steps_per_loop", "eval.", "checkpoint.", "summary.", "early_stopping.",
    "callbacks", "preemption.", "nan_policy.", "export", "export_tflite", "mode", "resume.", "strategy",
    "cpu_replicas", "num_gpus", "cluster.", "intra_op_threads", "inter_op_threads", "jit_compile", "deterministic",
    "model.fused_batchnorm",
    "model.remat", "model.remat_output_size", "model.remat_layers",  # recomputes, changes no value (tests/test_remat.py)
    "data.data_dir", "data.download", "data.pipeline_threads", "data.device_resident", "data.service",
    "init.",  # read at a run's first start only: a resume restores its own checkpoint and ignores init.*
    "find.", "check.", "sweep.", "tracking.",
)


def get_config(arg=None):
  """Returns the full default config. Every key a run reads is defined here, a group of sections per helper."""
  parse_arg(arg)  # base takes no arguments; rejects any.
  c = ml_collections.ConfigDict()
  _runtime(c)
  _data(c)
  _model_and_loss(c)
  _optimizer(c)
  _train(c)
  _init(c)
  _eval_and_checkpoints(c)
  _monitoring(c)
  _tracking(c)
  _finders(c)
  _checks(c)
  c.lock()  # a config file that sets a key defined nowhere here (a misspelling) fails, as on the command line
  c.model.kwargs.unlock()  # the model's and the loss's own arguments: any key
  c.loss.kwargs.unlock()
  c.task.kwargs.unlock()
  return c


def _runtime(c):
  """Seed, determinism, mode, strategy, threads and the cluster."""
  c.seed = 0  # seeds every random draw: weights, data order, augmentation (with `deterministic`: bit-identical reruns)
  c.deterministic = False  # tf.config.experimental.enable_op_determinism(), and Grappler's constant folding off

  # train | evaluate: a sidecar evaluator that trains nothing; it evaluates each new checkpoint of the workdir once
  # (summaries in workdir/eval, best checkpoint in workdir/eval/best) and exits after the final one. A TF_CONFIG task of
  # type "evaluator" runs in this mode. | predict: a checkpoint's outputs for every example (predict.*), written once
  # each in input order ([after training](after_training.md)).
  c.mode = "train"
  # one_device | mirrored | central_storage | multi_worker_mirrored | parameter_server | tpu ([several
  # machines](clusters.md))
  c.strategy = "one_device"
  c.cpu_replicas = 0  # >0: N logical CPU devices (mirrored on a CPU-only machine). 0 = off.
  c.num_gpus = config_dict.placeholder(int)  # None = all visible GPUs.
  c.intra_op_threads = 0  # TensorFlow threads per op (0 = TensorFlow's default: all cores)
  c.inter_op_threads = 0  # ops run in parallel (0 = default)

  c.cluster = ml_collections.ConfigDict()
  # auto | tf_config | slurm | mpi | k8s | local (see loops/distribute/cluster.py). k8s: a Kubernetes Indexed Job's or
  # JobSet's pods (JOB_COMPLETION_INDEX, K8S_JOB_COMPLETIONS, ...: launch/k8s/README.md); auto takes it when no
  # TF_CONFIG, MPI launcher or srun step of several tasks is found and both those variables are set.
  c.cluster.source = "auto"
  # SLURM: task i of a node listens on port_base + i. None = 20000 + (SLURM_JOB_ID % 199) * 64 (ports 20000-32735,
  # below Linux's ephemeral range): distinct for jobs and array tasks sharing a node (loops/distribute/cluster.py).
  c.cluster.slurm_port_base = config_dict.placeholder(int)
  c.cluster.k8s_port = 2222  # cluster.source k8s: the port every pod listens on (each pod has its own network)
  c.cluster.collective = "auto"  # multi_worker_mirrored all-reduce: auto | ring | nccl
  # multi_worker_mirrored: the gradient all-reduce in packs of about this many bytes, the last layers' first, so
  # a pack can travel while the backward pass computes the layers before it (not with jit_compile, float16 loss
  # scaling or optimizer.global_clipnorm, which need every gradient first). 0 = one all-reduce of all gradients.
  # On CPUs over loopback 4 packs left workers idler than one all-reduce (benchmarks/README.md): for real networks.
  c.cluster.bytes_per_pack = 0
  c.cluster.collective_timeout_seconds = config_dict.placeholder(float)  # None = wait forever.
  c.cluster.tpu = ""  # strategy=tpu: TPU name or grpc:// address ("" = from the environment, e.g. a TPU VM).
  # A worker whose peers (MPI: their address files) have not all joined within this many seconds stops with one
  # line naming the addresses nothing listens on, exit status 143 (128 + SIGTERM: restartable); SIGTERM and
  # Ctrl-C end the wait at once.
  c.cluster.startup_timeout_seconds = 600.0


def _data(c):
  """The dataset, its preprocessing and the input path."""
  c.data = ml_collections.ConfigDict()
  # digits | synthetic | mnist | fashion_mnist | cifar10 | cifar100 | quickdraw_bitmap | image_folder | npz | tfrecord |
  # tfds:<any tfds name> | package.module:function (a task's arrays, or an input function) ([data](data.md#sources))
  c.data.name = "digits"
  c.data.train_split = "train"  # npz: split S reads the arrays x_S and y_S
  c.data.eval_split = "test"  # the split evaluated (npz: x_S and y_S)
  # tfds data_dir (None = tfds default, ~/tensorflow_datasets); image_folder: ROOT of ROOT/<split>/<class>/*.png;
  # npz: PATH.npz holding x_train, y_train, x_test, y_test (keras.datasets' load_data() saved with np.savez).
  # Any tf.io.gfile path (local, gs://, ram://).
  c.data.data_dir = config_dict.placeholder(str)
  # the class count of a task's data (module:function, npz features/targets, tfrecord features), for the built-in
  # classifier or ctx.config_model(); None = the largest integer target + 1 of array data (unknown for an input
  # function: set it).
  c.data.num_classes = config_dict.placeholder(int)
  c.data.npz = ml_collections.ConfigDict()
  # npz with any named arrays (for a task): split S reads <name>_S for each name; one name gives that array, several a
  # dict of them. Both empty: the classic x_S (uint8 images) and y_S (class ids).
  c.data.npz.features = ()
  c.data.npz.targets = ()  # the targets' array names (see data.npz.features)
  c.data.corrupt_images = "fail"  # image_folder: an unreadable/corrupt file stops the run (fail) or is counted (skip)
  c.data.download = True  # let tfds try to download when the data is not on disk.
  c.data.image_size = config_dict.placeholder(int)  # resize to (size, size); None = keep.
  c.data.mean = config_dict.placeholder(tuple)  # per-channel mean after scaling to [0, 1]; None = no shift.
  # per-channel standard deviation after scaling to [0, 1]; None = no scaling.
  c.data.std = config_dict.placeholder(tuple)
  c.data.random_flip = False  # random left-right flip of training images.
  # mixup / cutmix (0 = off; typical 0.2 / 1.0): pairs of the GLOBAL batch mixed with a Beta(alpha, alpha) share,
  # keyed per step (exact resume, same on any number of replicas); labels become soft. Both set: one per batch.
  c.data.mixup_alpha = 0.0
  c.data.cutmix_alpha = 0.0  # cutmix (0 = off; typical 1.0); see data.mixup_alpha
  # load whole splits into memory (tfds, image folders, TFRecords): full per-epoch permutations, device-resident input.
  # False streams them ([data that does not fit in memory](data.md#data-that-does-not-fit-in-memory)): each input
  # pipeline reads only its own files or images, in an order keyed on (seed, epoch). npz files are always held in
  # memory.
  c.data.in_memory = True
  # Streamed record files: the train split's files are dealt into this many streams (balanced by record count);
  # each step takes global batch / streams records of each. It must divide the global batch and be a multiple of
  # the number of workers, and the split needs at least this many files.
  c.data.streams = 8
  # Streamed record files: records of a stream permuted together (a keyed window; memory: streams x window raw
  # records). Larger = closer to a full shuffle (files are also read in a keyed order every epoch).
  c.data.shuffle_window = 2_048
  # data.name=tfrecord: data_dir is a directory written by `python -m data.prepare` (its manifest says the rest),
  # or a glob with {split} (e.g. gs://bucket/imagenet/{split}-*) of tf.train.Example files with these features.
  c.data.tfrecord = ml_collections.ConfigDict()
  c.data.tfrecord.image_key = "image"  # encoded JPEG/PNG bytes (tfds' key), or raw uint8 with image_shape
  c.data.tfrecord.label_key = "label"  # int64 class id
  c.data.tfrecord.image_shape = config_dict.placeholder(tuple)  # None: from the manifest or the first record
  c.data.tfrecord.num_classes = config_dict.placeholder(int)  # None: from the manifest (needed without one)
  # A prepared directory's manifest is checked at every start against its files' sizes and the first file's record
  # count (cheap); True also reads every file for its SHA-256 and record count (as --dry_run does).
  c.data.tfrecord.verify = False
  # Any named features for a task instead of image + label (data/tfrecord_features.py): 'name:dtype:shape' entries
  # ('tokens:int64:128', 'tags:float32:5'), the targets among them by name; data_dir a glob with {split}.
  c.data.tfrecord.features = ()
  c.data.tfrecord.targets = ()  # the targets among data.tfrecord.features, by name
  # a tf.data service dispatcher (grpc://HOST:PORT): the train pipeline's reading, decoding and augmentation run on its
  # data workers instead of the training hosts ("" = off; [the tf.data service](data.md#the-tfdata-service))
  c.data.service = ""
  # The longest wait for the service (seconds): for its dispatcher to answer at the start, and for a batch while a
  # train call runs (a data worker lost); then one line and the preemption exit code (a rerun resumes). A signal
  # (preemption.signals, Ctrl-C) during such a wait ends the run at once, without a save. Tracing the train call is
  # not a wait; with jit_compile, XLA's compile in the first call is: set it above that.
  c.data.service_timeout_seconds = 120.0
  # Input-pipeline threads: None = auto (1 when training on CPU, so the pipeline does not compete with the
  # step's threads; tf.data's default pool with GPUs/TPUs), 0 = tf.data's default, N = a private pool of N.
  c.data.pipeline_threads = config_dict.placeholder(int)
  # auto | on | off: keep an in-memory train split on every replica's device and gather each step's batch there,
  # inside the compiled loop (the host pipeline's exact batches, no per-step input hand-off). auto and on: when
  # the split fits device_resident_max_bytes per device and the run is synchronous (flips and mixup/cutmix too);
  # otherwise the host pipeline, with a log line saying why. --dry_run reports the decision and the bytes.
  c.data.device_resident = "auto"
  # data.device_resident auto/on: the largest train split (bytes per device) kept on the devices (2 GiB)
  c.data.device_resident_max_bytes = 2 * 2**30
  c.data.synthetic = ml_collections.ConfigDict()
  c.data.synthetic.image_shape = (28, 28, 1)  # data.name=synthetic: the image shape
  c.data.synthetic.num_classes = 10  # data.name=synthetic: the class count
  c.data.synthetic.train_examples = 2048  # data.name=synthetic: train examples
  c.data.synthetic.eval_examples = 512  # data.name=synthetic: eval examples


def _model_and_loss(c):
  """The task, the model and the loss."""
  c.task = ml_collections.ConfigDict()
  # "classification" (the built-in: model.name, loss.name, eval.metrics) or "package.module:Name", a subclass of
  # loops.task.Task ([write a task](tasks.md))
  c.task.name = "classification"
  c.task.kwargs = ml_collections.ConfigDict()  # passed to the task class: Name(**kwargs)
  c.model = ml_collections.ConfigDict()
  c.model.name = "digits_cnn"  # a registry name (models/__init__.py) or "package.module:function"
  c.model.kwargs = ml_collections.ConfigDict()  # passed to the model function: fn(input_shape, num_classes, **kwargs)
  # Every BatchNormalization computes its statistics over the global batch (all replicas and workers), so N
  # replicas compute what one does; costs one all-reduce per BatchNorm layer and step.
  c.model.sync_batchnorm = False
  # Run each eligible BatchNormalization (channels last, no renorm or sync) through TensorFlow's fused kernel (one
  # op forward, one backward; Keras 3 runs about ten): the same statistics and moving averages; a ResNet-20 step
  # 1.31-1.49x faster, ResNet50V2 1.22x on a 2-core CPU (benchmarks/README.md). The saved model keeps Keras'
  # layers. False = Keras' own ops.
  c.model.fused_batchnorm = True
  # Rematerialization: activations recomputed in the backward pass instead of kept (less memory, more compute).
  # "" = off; Keras' keras.RematScope modes "full" (every layer), "larger_than" (layers whose output is larger than
  # model.remat_output_size), "list_of_layers" (model.remat_layers); "blocks" = every residual block of a
  # functional model recomputed as one (the built-in ResNets). Every model the run builds; docs/recipes.md.
  c.model.remat = ""
  # "larger_than": a layer is recomputed when its output has more than this many values per example.
  c.model.remat_output_size = 1024
  # "list_of_layers": layer names or fnmatch patterns (e.g. ["conv2_block1_*"]) of the layers recomputed.
  c.model.remat_layers = []

  c.loss = ml_collections.ConfigDict()
  # "" = the loss the model was compile()d with (per example, averaged over the global batch; its metrics join
  # eval.metrics), else sparse_categorical_crossentropy. Or a registry name (loops/modeling/losses.py) or
  # "package.module:function"; a name set here wins over a compiled loss (a warning says so).
  c.loss.name = ""
  c.loss.label_smoothing = 0.0  # the built-in cross-entropy's label smoothing
  c.loss.kwargs = ml_collections.ConfigDict()  # passed to the loss function: fn(labels, logits, **kwargs); any key


def _optimizer(c):
  """The optimizer and its learning-rate schedule."""
  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "sgd"  # sgd | adam | adamw
  c.optimizer.learning_rate = 0.01  # base learning rate, before lr_scaling.
  # none | linear_replicas (lr x replicas, the seeds' rule) | linear_batch_256 | sqrt_replicas
  c.optimizer.lr_scaling = "none"
  c.optimizer.momentum = 0.9  # sgd: momentum
  c.optimizer.nesterov = False  # sgd: Nesterov momentum
  # passed to the Keras optimizer (adamw's decoupled decay; None = the optimizer's default)
  c.optimizer.weight_decay = config_dict.placeholder(float)
  c.optimizer.global_clipnorm = config_dict.placeholder(float)  # clip gradients by their global norm.
  # > 0: keep an exponential moving average of the weights (Keras' use_ema, e.g. 0.999); eval, the best
  # checkpoint and the export use the averaged weights; training continues from the raw ones. 0 = off.
  c.optimizer.ema_decay = 0.0
  # Learning-rate schedule over optimizer updates: constant | piecewise | cosine, after an optional linear
  # warmup from 0. Given in epochs, so batch-size overrides never leave them stale.
  c.optimizer.schedule = "constant"
  c.optimizer.warmup_epochs = 0.0  # linear warmup from 0, in epochs, before the schedule
  c.optimizer.decay_epochs = ()  # piecewise: epochs at which the lr is multiplied by decay_factor.
  c.optimizer.decay_factor = 0.1  # piecewise: the factor applied at each of decay_epochs
  c.optimizer.final_lr_fraction = 0.0  # cosine: final lr = fraction x peak lr.


def _train(c):
  """Batch, length, steps per call, precision."""
  c.train = ml_collections.ConfigDict()
  # The global batch is the unit. If global_batch_size is None, it is per_replica_batch_size x replicas.
  c.train.global_batch_size = config_dict.placeholder(int)
  # the batch per replica when train.global_batch_size is None
  c.train.per_replica_batch_size = config_dict.placeholder(int)
  # Length: train.steps if set, else train.epochs x steps per epoch.
  c.train.steps = config_dict.placeholder(int)
  c.train.epochs = config_dict.placeholder(float)  # the length in epochs when train.steps is not set
  c.train.steps_per_loop = 10  # steps per compiled call; summaries/progress at this interval.
  # k > 1: each step splits every replica's batch into k micro-batches and applies their summed gradients
  # once (same update as the whole batch, ~1/k of the activation memory; BatchNorm sees micro-batches).
  c.train.grad_accum_steps = 1

  # Regular expressions searched in each layer's path (e.g. "digits_cnn/conv1"; nested layers too): those layers'
  # weights get no gradient (not computed, not all-reduced) and no update. () = train everything.
  c.train.freeze = ()
  # True: frozen BatchNormalization layers run in inference mode (their moving statistics, never updated).
  # False: they normalise with batch statistics and update their moving averages; only gamma/beta are frozen.
  c.train.freeze_batchnorm_stats = True

  # None | "bfloat16" | "float16" (with loss scaling; refused under central_storage on several replicas, where Keras
  # cannot update the loss scale): every model computes in it, a task's own included (docs/tasks.md)
  c.mixed_precision = config_dict.placeholder(str)
  c.jit_compile = False  # XLA-compile the per-replica step.


def _init(c):
  """Warm start: a new run's weights from another run or a Keras file (read at the first start only)."""
  c.init = ml_collections.ConfigDict()
  # "" = random init. A workdir (its latest checkpoint), a checkpoint prefix (.../ckpt-N), a .keras file or a
  # .weights.h5 file; any tf.io.gfile path. Variables are matched by their place in the model and their shape.
  # A workdir with checkpoints of its own resumes from them and ignores this.
  c.init.checkpoint = ""
  c.init.exclude = ()  # regular expressions searched in variable paths (e.g. "logits"): those start fresh
  # Stop (one line, before training) when less than this fraction of the model's weights, counted in scalars
  # (every variable, BatchNorm statistics included), would be loaded: a wrong path must not train from scratch.
  c.init.min_fraction = 0.5
  # True: also take the optimizer's slots (momentum, Adam moments) of the loaded variables where they match
  # (checkpoint sources only). The step, the optimizer's iteration count and the schedule start fresh.
  c.init.optimizer_state = False


def _eval_and_checkpoints(c):
  """Evaluation, checkpoints, the NaN policy and preemption."""
  c.eval = ml_collections.ConfigDict()
  c.eval.every_steps = 0  # 0 = only at the end. Any number: a train call is shortened to end on the boundary.
  # reported as eval/<name>, with eval/loss always: registry names (accuracy, top5_accuracy) or "package.module:factory"
  # strings whose factory() returns a keras.metrics.Metric ([write a metric](recipes.md#write-a-metric))
  c.eval.metrics = ("accuracy", "top5_accuracy")
  c.eval.sidecar_poll_seconds = 10.0  # mode=evaluate: how often to look for a new checkpoint
  c.eval.sidecar_timeout_seconds = 3600.0  # mode=evaluate: give up after this long without a new checkpoint
  # mode=evaluate: "" = watch the training's checkpoints (the sidecar); latest, best, a step or a checkpoint path =
  # evaluate that one once into workdir/eval/<data>_<split>/checkpoint-<step>.json and its eval_checkpoint/<name>.
  c.eval.checkpoint = ""

  # mode=predict (docs/after_training.md): the task's predict_step outputs (the classifier: probabilities, class,
  # label) of every example, on any strategy, into workdir/predictions/<data>_<split>-<step>/ (a folder's name
  # for predict.input): part-*.npz + manifest.json.
  c.predict = ml_collections.ConfigDict()
  c.predict.checkpoint = "latest"  # mode=predict: latest | best | a step | a checkpoint path
  # "" = the data's eval split (data.eval_split: set it to predict another split); a directory (searched recursively) or
  # a glob of image files = those images in sorted path order, resized to the trained shape
  c.predict.input = ""
  c.predict.rows_per_file = 10_000  # rows per .npz part: a killed prediction resumes from its last whole part

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 1000  # 0 = only at the end (any number of steps, as eval.every_steps).
  c.checkpoint.keep = 3  # how many periodic checkpoints to keep in workdir/checkpoints
  # periodic saves hand the write to a background thread (TensorFlow's asynchronous checkpointing): the loop only waits
  # for a copy of the variables in host memory. The final, best and preemption saves always wait. Used with one_device,
  # mirrored, multi_worker_mirrored; other strategies save blocking ([asynchronous
  # saves](reliability.md#asynchronous-saves))
  c.checkpoint.async_save = True
  # Keep the best checkpoint by this eval result in workdir/best ("" = off): eval/loss or eval/<an eval.metrics name>.
  c.checkpoint.best_metric = "eval/accuracy"
  c.checkpoint.best_mode = "max"  # max | min
  # A non-finite loss is detected after each train call (no extra host sync per step). stop: one error line
  # naming the steps. rollback: restore the last checkpoint, rewind the input, retry (at most max_retries).
  c.nan_policy = ml_collections.ConfigDict()
  # a non-finite loss, detected after each train call (no extra host sync per step): stop (one error line naming the
  # steps) | rollback (restore the last checkpoint, rewind the input, retry)
  c.nan_policy.mode = "stop"
  c.nan_policy.max_retries = 3  # rollback: retries before a persistent NaN stops the run

  # On one of these signals every task saves a checkpoint at the current step and exits with exit_code; rerunning
  # the same command resumes there. 143 (128 + SIGTERM) is what TFJob's ExitCode restart policy and GCE treat as
  # restartable; user errors exit 1. SLURM templates add SIGUSR1 (sbatch --signal=B:USR1@120) and requeue.
  c.preemption = ml_collections.ConfigDict()
  c.preemption.signals = "SIGTERM"  # comma-separated: SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP, SIGCONT
  # the exit code after a preemption save: 143 (128 + SIGTERM) is what TFJob's ExitCode restart policy and GCE treat as
  # restartable; user errors exit 1
  c.preemption.exit_code = 143

  # A rerun on a workdir with checkpoints resumes. Settings that change the optimisation or the data (optimizer,
  # schedule, batch, seed, model, loss, dataset, mixup, precision, ...) must then be what the run was started with,
  # else it stops with one line (key: recorded -> now); True trains on with the new values (recorded in
  # workdir/starts.jsonl). Length, cadence, logging, devices and cluster may always change; on another number
  # of replicas the recorded global batch and learning rate are kept (loops/resume.py).
  c.resume = ml_collections.ConfigDict()
  # a rerun whose optimisation or data settings differ from the recorded start stops with one line (key: recorded ->
  # now); True trains on with the new values (recorded in workdir/starts.jsonl)
  c.resume.accept_changes = False


def _monitoring(c):
  """Summaries, early stopping, user callbacks and the export."""
  c.summary = ml_collections.ConfigDict()
  c.summary.histogram_every_steps = 0  # weight and gradient-norm histograms every N steps (0 = off)
  c.summary.progress_bar = "auto"  # the live bar: auto (stdout and stderr a terminal; else a line per call) | on | off
  # (first, last): a TensorBoard profiler trace of these steps (rounded out to whole train calls); the chief traces,
  # into workdir/profile (the other workers of a multi-worker job do not: TensorFlow 2.21's profiler aborts a non-chief
  # worker that stops a trace).
  c.summary.profile_steps = ()
  # The HParams tab's experiment (every config key as an HParam) in the workdir. A sweep (launch/sweep.py) sets
  # False: its trials write only their sessions and the sweep writes one experiment of the swept keys at its dir.
  c.summary.hparams_experiment = True
  # Multi-worker: a worker whose busy time per train call is more than straggler_fraction above the median
  # worker's for straggler_calls calls in a row is named in one warning (0 = never warn).
  c.summary.straggler_fraction = 0.2
  c.summary.straggler_calls = 3  # calls in a row above summary.straggler_fraction before a worker is named

  # Stop when early_stopping.metric ("" = off; eval/loss or eval/<metric>) has not improved by more than
  # min_delta for `patience` evals in a row; then the final eval, checkpoint and summary.json ("stopped_early").
  # Its state (best value, evals since) is checkpointed: it survives preemption and resume.
  c.early_stopping = ml_collections.ConfigDict()
  # stop when this eval result ("" = off; eval/loss or eval/<metric>) has not improved by more than min_delta for
  # `patience` evals in a row; then the final eval, checkpoint and summary.json ("stopped_early"). Its state is
  # checkpointed: it survives preemption and resume.
  c.early_stopping.metric = ""
  c.early_stopping.mode = "min"  # min | max
  c.early_stopping.patience = 5  # evals without an improvement before the stop
  c.early_stopping.min_delta = 0.0  # the smallest change that counts as an improvement

  # user callbacks: "package.module:factory" strings; factory(config) returns an object with any of on_train_begin /
  # after_train_call / after_eval / on_call_end / on_train_end(state) ([write a callback](recipes.md#write-a-callback))
  c.callbacks = ()

  # Set by `python -m launch.sweep` for each trial (never by hand): the fingerprint of the trial's settings, written
  # to summary.json (`sweep_settings`) so a rerun of the sweep knows which settings a summary proves; with an Optuna
  # study (--search=tpe or --prune), the study's journal file and this trial's number: at every eval the run reports
  # checkpoint.best_metric to the trial, and stops when the study's pruner says so ("pruned at step S (value V)").
  c.sweep = ml_collections.ConfigDict()
  # set by `python -m launch.sweep` for each trial (never by hand): the fingerprint of the trial's settings, written to
  # summary.json (`sweep_settings`)
  c.sweep.settings = ""
  c.sweep.study = ""  # set by the sweep: the Optuna study's journal file (--search=tpe or --prune)
  c.sweep.trial = -1  # set by the sweep: this trial's number in the study (-1 = none)

  # at the end write workdir/export/model.keras (the final model) and workdir/export/saved_model (serving_default: raw
  # images in, the eval's preprocessing inside, probabilities and classes out; a task's: its features in, its
  # predict_step outputs out; [serving](serving.md))
  c.export = True
  # also write workdir/export/model.tflite (LiteRT, built-in ops only): the classifier's raw float32 images ->
  # probabilities and classes, a task's features -> its predict_step outputs; needs `export`. Ops LiteRT lacks: one
  # warning line naming them and no .tflite ([serving](serving.md#litert-modeltflite))
  c.export_tflite = False


def _tracking(c):
  """MLflow and Weights & Biases (loops/persist/tracking.py): from the chief only, the flattened config and the
  plan as params, every train/eval scalar at its step (what TensorBoard gets), tags (task, strategy, replicas,
  workers, git commit), summary.json and best.json as artifacts; a resumed run continues the same tracker run. A
  sidecar evaluator (mode=evaluate, launch.local --evaluator) tracks its eval/ curve in a run of its own, named
  '<workdir name>-evaluator' (MLflow: a child of the training's run; W&B: grouped with it)."""
  c.tracking = ml_collections.ConfigDict()
  c.tracking.mlflow = ""  # "" = off; a store (sqlite:///abs/mlflow.db; file:/abs/dir only with MLFLOW_ALLOW_FILE_STORE=true) or a server (http://host:port)
  c.tracking.wandb = ""  # "" = off; a W&B project (WANDB_MODE=offline: kept in workdir/wandb for `wandb sync`)
  c.tracking.experiment = ""  # MLflow experiment; "" = the name of the folder holding the workdir (runs/r50 -> runs)
  c.tracking.log_export = False  # also send workdir/export (model.keras, saved_model) as artifacts
  c.tracking.close_timeout_seconds = 30.0  # at the end, wait at most this long for values still being sent
  c.tracking.parent_run = ""  # set by `python -m launch.sweep` (never by hand): the sweep's MLflow parent run
  c.tracking.group = ""  # set by `python -m launch.sweep` (never by hand): the sweep's W&B group


def _finders(c):
  """`python main.py ... --find=lr|batch_size` (loops/finders/): a fresh model, no checkpoints; the output goes to
  workdir/lr_find or workdir/batch_size_find. Read by the finders only: a run ignores them."""
  c.find = ml_collections.ConfigDict()
  # LR range test: the learning rate rises exponentially from lr_min to lr_max over lr_steps steps (one step per
  # train call); it stops early once the smoothed loss exceeds diverge_factor x its lowest value (or is not finite).
  c.find.lr_min = 1e-6
  c.find.lr_max = 1.0  # LR range test: the last learning rate
  c.find.lr_steps = 200  # LR range test: steps from lr_min to lr_max
  c.find.smoothing = 0.95  # beta of the loss's exponential moving average (bias-corrected)
  c.find.diverge_factor = 4.0  # LR range test: stop once the smoothed loss exceeds this x its lowest value
  # Batch-size finder: per-replica sizes granularity, 2x, 4x, ... then a binary search in multiples of
  # granularity, up to max_per_replica_batch (and one epoch of the train split). A size fits when a few train
  # steps do not run out of device memory (GPU) or, on CPU, add at most memory_budget_gb to the process's
  # resident memory (required on a machine without GPU).
  c.find.granularity = 8
  c.find.max_per_replica_batch = 4096  # batch-size finder: the largest per-replica batch tried
  # batch-size finder: the growth of resident memory (CPU, required without a GPU) or device memory (GPU, optional) a
  # size may take
  c.find.memory_budget_gb = config_dict.placeholder(float)
  c.find.timed_steps = 10  # train steps timed per size (after one untimed call that compiles)


def _checks(c):
  """`python main.py ... --check=replicas|workers` (loops/replica_check.py): train steps on 1 replica and on 2
  replicas (or 2 workers), each from the same weights, judged against what rounding explains. Read by the checks
  only: a run ignores them."""
  c.check = ml_collections.ConfigDict()
  # Steps each side takes, each from the one-replica side's weights (1 to 100 and more: a difference cannot grow
  # from step to step); 0 = enough to reach every branch the task declares (Task.update_every: the least common
  # multiple of its periods), at least 3.
  c.check.steps = 0


def use_cifar10(c, synthetic):
  """CIFAR-10 (or synthetic images of its shape): normalised with its channel statistics, random flips."""
  # digits | synthetic | mnist | fashion_mnist | cifar10 | cifar100 | quickdraw_bitmap | image_folder | npz | tfrecord |
  # tfds:<any tfds name> | package.module:function (a task's arrays, or an input function) ([data](data.md#sources))
  c.data.name = "synthetic" if synthetic else "cifar10"
  c.data.synthetic.image_shape = (32, 32, 3)  # data.name=synthetic: the image shape
  c.data.mean = (0.4914, 0.4822, 0.4465)  # per-channel mean after scaling to [0, 1]; None = no shift.
  c.data.std = (0.2470, 0.2435, 0.2616)  # per-channel standard deviation after scaling to [0, 1]; None = no scaling.
  c.data.random_flip = True  # random left-right flip of training images.


def parse_arg(arg, **defaults):
  """Parses a config argument "a=1,b,c=x" (big_vision style) against typed defaults.

  A bare key means True. Unknown keys and badly typed values raise ValueError naming the valid keys.
  Returns a ConfigDict with every key of `defaults`.
  """
  parsed = ml_collections.ConfigDict(defaults)
  if not arg:
    return parsed
  for item in arg.split(","):
    key, _, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      valid = ", ".join(sorted(defaults)) or "(none)"
      raise ValueError(f"unknown config argument '{key}'; valid arguments: {valid}")
    default = defaults[key]
    if not _:
      value = "true" if isinstance(default, bool) else None
      if value is None:
        raise ValueError(f"config argument '{key}' needs a value: {key}=<{type(default).__name__}>")
    parsed[key] = _convert(key, value, default)
  return parsed


def _convert(key, value, default):
  if isinstance(default, bool):
    if value.lower() in ("1", "true", "yes"):
      return True
    if value.lower() in ("0", "false", "no"):
      return False
    raise ValueError(f"config argument '{key}' takes true/false, got '{value}'")
  try:
    return type(default)(value)
  except ValueError:
    raise ValueError(f"config argument '{key}' takes a {type(default).__name__}, got '{value}'") from None


# --- the reference: python -m configs.base > docs/configuration.md (tests/test_docs.py fails when it differs) ---

REFERENCE_INTRO = """# Configuration reference

Every key of `configs/base.py`'s `get_config()`, with its default and meaning (this page is generated from that
file: `python -m configs.base > docs/configuration.md`). Set any of them with `--config.KEY=VALUE` (typos are
refused with the nearest valid key) or in a config file under `configs/`; `model.kwargs`, `loss.kwargs` and
`task.kwargs` take any key (Python literals). Tuples on the command line are quoted:
`--config.train.freeze="('conv',)"`.
"""


def meanings(source):
  """{key: its meaning}: the comment on the key's line, else the comment lines right above it."""
  found, above = {}, []
  for line in source.splitlines():
    stripped = line.strip()
    if stripped.startswith("#"):
      above.append(stripped.lstrip("#").strip())
      continue
    match = re.match(r"c\.([\w.]+) = .*?(?:  # (.*))?$", stripped)
    if match:
      found[match.group(1)] = match.group(2) or " ".join(above)
    above = []
  return found


def _leaves(config, prefix=""):
  for key in sorted(config.keys()):
    value = config[key]
    if isinstance(value, ml_collections.ConfigDict) and not key.endswith("kwargs"):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def shown(value):
  """A default as the reference shows it."""
  if isinstance(value, ml_collections.ConfigDict):
    return "{}"
  return f'`"{value}"`' if isinstance(value, str) else f"`{value!r}`"


def reference():
  """docs/configuration.md: one table per group (the top-level keys first), keys in alphabetical order."""
  with open(__file__) as f:
    explained = meanings(f.read())
  groups = {}
  for key, value in _leaves(get_config()):
    meaning = explained.get(key, "").replace("|", "\\|")
    groups.setdefault(key.split(".")[0] if "." in key else "", []).append(f"| `{key}` | {shown(value)} | {meaning} |")
  tables = [f"## {group or 'Top level'}\n\n| key | default | meaning |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n"
            for group, rows in sorted(groups.items())]
  return "\n".join([REFERENCE_INTRO, *tables])


if __name__ == "__main__":
  sys.stdout.write(reference())
