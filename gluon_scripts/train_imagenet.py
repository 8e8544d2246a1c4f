"""Train a gluoncv model zoo network (resnet50_v1, vgg16, mobilenet1.0, ...) on ImageNet
RecordIO with any kvstore, e.g. Hylo's compressed dist_sync.

    python -m kvstore_ext.launch -n 8 -s 8 --launcher ssh -H hosts \\
        python gluon_scripts/train_imagenet.py --kvstore dist_sync_hylo --model resnet50_v1 \\
        --gpus 0,1,2,3 --rec-train /data/imagenet/rec/train.rec ... --save-dir /shared/ckpt

Data: the RecordIO pair that MXNet's tools/im2rec.py writes (and gluoncv's
imagenet.py --help describes): --rec-train/--rec-train-idx and --rec-val/--rec-val-idx,
read with mx.io.ImageRecordIter. Worker r of n reads part r of n of the training
records (part_index/num_parts), shuffled with a seed from --seed and the epoch; every
worker evaluates on the whole validation set. Training augmentation as gluoncv's
train_imagenet.py: random resized crop, flip, colour jitter and PCA lighting noise.

Checkpoints (--save-dir, every epoch by default) hold the parameters, the trainer's
states and the kvstore's error-feedback residuals, one set of files per worker;
--resume continues a run exactly where it stopped.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import cli, data, deps, errors, kvstore_setup, runner  # noqa: E402

MEAN_RGB = [123.68, 116.779, 103.939]
STD_RGB = [58.393, 57.12, 57.375]
TRAIN_SIZE, VAL_SIZE = 1281167, 50000
REC = '~/.mxnet/datasets/imagenet/rec/'


def parse_args():
    p = cli.base_parser(*__doc__.split('\n\n', 1),
                        num_epochs=120, batch_size=32, lr=0.1, lr_mode='cosine',
                        lr_steps='30,60,90', warmup_epochs=5, optimizer='nag', wd=1e-4,
                        save_dir='params', log_interval=50)
    g = p.script_group
    g.add_argument('--model', default='resnet50_v1',
                   help='a gluoncv model zoo classification model (resnet18_v1, resnet50_v1b, '
                        'vgg16, mobilenet1.0, ...)')
    g.add_argument('--rec-train', default=REC + 'train.rec', help='the training RecordIO file')
    g.add_argument('--rec-train-idx', default=REC + 'train.idx', help='... and its index')
    g.add_argument('--rec-val', default=REC + 'val.rec', help='the validation RecordIO file')
    g.add_argument('--rec-val-idx', default=REC + 'val.idx', help='... and its index')
    g.add_argument('-j', '--num-data-workers', dest='data_threads', type=int, default=4,
                   help='decoding threads of each ImageRecordIter')
    g.add_argument('--input-size', type=int, default=224, help='side of the network input')
    g.add_argument('--crop-ratio', type=float, default=0.875,
                   help='validation: resize to input-size / crop-ratio, then centre crop')
    g.add_argument('--num-classes', type=int, default=1000,
                   help='classes of the network\'s output (the labels in the files)')
    g.add_argument('--label-smoothing', type=float, nargs='?', const=0.1, default=0.0,
                   metavar='EPS', help='smooth the one-hot targets by EPS (0.1 if no value)')
    g.add_argument('--batch-norm', action='store_true', help='vgg: with batch normalisation')
    g.add_argument('--use-se', action='store_true', help='resnext: with SE blocks')
    g.add_argument('--last-gamma', action='store_true',
                   help="initialise the last BN's gamma of each residual block to zero")
    return p.parse_args()


def count_records(idx_path):
    with open(os.path.expanduser(idx_path)) as f:
        return sum(1 for line in f if line.strip())


class RecordData:
    """ImageRecordIter batches; a fresh iterator every epoch, seeded by (seed, epoch,
    rank), so that the epoch's order and augmentation do not depend on what came before
    (a resumed run sees the same batches). Every worker takes the same number of
    batches an epoch: floor(records / workers / batch)."""

    def __init__(self, args, rank, num_workers, worker_batch):
        import mxnet as mx
        self.mx, self.args, self.rank, self.num_workers = mx, args, rank, num_workers
        self.batch = worker_batch
        self.train_records = count_records(args.rec_train_idx)
        self.batches_per_epoch = data.limit_batches(
          self.train_records // num_workers // worker_batch, args.num_batches)
        if self.batches_per_epoch < 1:
            raise errors.UsageError('%s has %d records: too few for %d worker(s) with %d '
                                    'images a step each' % (args.rec_train_idx,
                                                            self.train_records, num_workers,
                                                            worker_batch))
        side = args.input_size
        self.common = dict(data_shape=(3, side, side), batch_size=worker_batch,
                           preprocess_threads=args.data_threads, verbose=False,
                           mean_r=MEAN_RGB[0], mean_g=MEAN_RGB[1], mean_b=MEAN_RGB[2],
                           std_r=STD_RGB[0], std_g=STD_RGB[1], std_b=STD_RGB[2])

    def train_batches(self, epoch):
        a = self.args
        seed = (a.seed * 10007 + epoch * 101 + self.rank) % (2 ** 31)
        it = self.mx.io.ImageRecordIter(
            path_imgrec=os.path.expanduser(a.rec_train),
            path_imgidx=os.path.expanduser(a.rec_train_idx),
            part_index=self.rank, num_parts=self.num_workers, shuffle=True, seed=seed,
            seed_aug=seed, rand_mirror=True, random_resized_crop=True,
            max_aspect_ratio=4. / 3., min_aspect_ratio=3. / 4.,
            max_random_area=1, min_random_area=0.08,
            brightness=0.4, contrast=0.4, saturation=0.4, pca_noise=0.1, **self.common)
        for i, batch in enumerate(it):
            if i >= self.batches_per_epoch:
                break
            yield batch.data[0], batch.label[0]

    def eval_batches(self):
        a = self.args
        it = self.mx.io.ImageRecordIter(
            path_imgrec=os.path.expanduser(a.rec_val),
            path_imgidx=os.path.expanduser(a.rec_val_idx), shuffle=False,
            resize=int(round(a.input_size / a.crop_ratio)), **self.common)
        for i, batch in enumerate(it):
            if a.num_batches and i >= a.num_batches:
                break
            n = batch.data[0].shape[0] - batch.pad     # the last batch is padded
            yield batch.data[0][:n], batch.label[0][:n]


def get_net(args, check_only=False):
    kvstore_setup.import_mxnet()
    zoo = deps.require_or_exit('gluoncv.model_zoo', "--model (gluoncv's model zoo)")
    get_model, get_model_list = zoo.get_model, zoo.get_model_list
    if args.model not in get_model_list():
        errors.fail('unknown --model %r (see gluoncv.model_zoo.get_model_list(): resnet18_v1, '
                    'resnet50_v1, resnet50_v1b, vgg16, mobilenet1.0, ...)' % args.model)
    if check_only:
        return None
    kwargs = {'classes': args.num_classes, 'pretrained': False}
    if args.model.startswith('vgg'):
        kwargs['batch_norm'] = args.batch_norm
    elif args.model.startswith('resnext'):
        kwargs['use_se'] = args.use_se
    if args.last_gamma:
        kwargs['last_gamma'] = True
    return get_model(args.model, **kwargs)


def main():
    args = parse_args()

    def check_data():
        what = 'ImageNet RecordIO, as tools/im2rec.py writes; see docs/REPRODUCE.md'
        data.check_files([('--rec-train', args.rec_train),
                          ('--rec-train-idx', args.rec_train_idx),
                          ('--rec-val', args.rec_val), ('--rec-val-idx', args.rec_val_idx)],
                         what)
        if args.input_size < 16:
            raise errors.UsageError('--input-size must be >= 16')
        if not 0 <= args.label_smoothing < 1:
            raise errors.UsageError('--label-smoothing must be in [0, 1)')

    def make_data(kv, worker_batch):
        if args.synthetic:
            side = args.input_size
            return data.SyntheticData(args, (3, side, side), args.num_classes, TRAIN_SIZE,
                                      VAL_SIZE, kv.rank, kv.num_workers, worker_batch)
        return RecordData(args, kv.rank, kv.num_workers, worker_batch)

    def make_net(ctxs):
        import mxnet as mx
        net = get_net(args)
        net.initialize(mx.init.MSRAPrelu(), ctx=ctxs)
        return net

    get_net(args, check_only=True)
    runner.run(args, 'imagenet-%s' % args.model, check_data, make_data, make_net,
               classes=args.num_classes, label_smoothing=args.label_smoothing,
               extra_summary={'model': args.model, 'dataset': 'imagenet',
                              'input_size': args.input_size, 'num_classes': args.num_classes})


if __name__ == '__main__':
    main()
