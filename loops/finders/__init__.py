"""The finders behind `python main.py --config=... --workdir=... --find=lr|batch_size`: runs built exactly as
training builds them (loops/build.py), on a fresh model, that write no checkpoint (loops/finders/trial.py)."""


def find(what, config, workdir):
  """Runs the LR range test (what="lr") or the batch-size finder ("batch_size"); returns its result dict."""
  from configs import settings as settings_lib
  from loops.finders import rules
  from loops.finders import trial
  settings = settings_lib.read(config)  # the bag itself stays for the throw-away runs' copies (trial.py)
  rules.check_finder(config, what, trial.replicas_on_gpu(settings.run))
  if what == "lr":
    from loops.finders import lr_range
    return lr_range.find_lr(config, settings.find, settings.optimizer, workdir)
  from loops.finders import batch_size
  return batch_size.find_batch_size(config, settings.find, settings.run, settings.cluster, settings.data, workdir)
