"""What the training scripts (train_mnist.py, train_cifar10.py, train_imagenet.py)
share, one job a module, so that every script trains, logs, checkpoints and reports
identically. A script supplies its network and a data source and calls
``runner.run``; the rest happens here.

| module | holds |
|---|---|
| ``errors`` | ``UsageError`` and the exits (one-line errors; hard exit once distributed) |
| ``deps`` | imports of the optional packages, with a ``pip install .[scripts]`` hint |
| ``cli`` | the flags every script has (``base_parser``) and their checks |
| ``kvstore_setup`` | ``--kvstore`` / ``--compression-params`` checks, the kvstore, the devices |
| ``optim`` | the Gluon trainer and the ``--lr-mode`` schedule |
| ``data`` | seeded, sharded batches: in-memory arrays and synthetic data |
| ``traffic`` | bytes pushed and pulled per step |
| ``report`` | logging, the progress bar, the final summary (JSON) |
| ``checkpoints`` | checkpoint files, ``--resume`` epoch agreement, restore |
| ``loop`` | the training loop, evaluation, BatchNorm statistics sync |
| ``runner`` | the whole run, in order, for every script |

Reproducibility: the data order, the augmentation and MXNet's random generator are
seeded from ``--seed``, the epoch and the rank at the start of every epoch, and a
checkpoint holds the parameters, the trainer's states (momentum, update count, so the
learning-rate schedule continues) and the kvstore's error-feedback residuals, so a
resumed run sees the batches and the state the uninterrupted run would have seen.

The scripts are run by path (``python gluon_scripts/train_X.py``), which puts
``gluon_scripts/`` on ``sys.path``: this package is imported as ``training``.
"""
