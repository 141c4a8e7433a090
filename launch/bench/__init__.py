"""Measurement tools: each one a module with its own flags, run as `python -m launch.bench.NAME`.

    step              train step, input pipeline and MFU of a config (--config)
    variants          a config's step under KEY=VALUE overrides, timed in turns
    eval              the chunked eval head at several chunk counts
    peers             our models against their PyTorch peers on one CPU device
    kernels           small kernels at one and two threads, JAX against torch
    cross_entropy     the written-out softmax cross-entropy against the textbook form
    collectives       collective algorithms against XLA's all-reduce, with TPU estimates
    startup           time to run_start, first run against a repeat on one cache
    tpu               the TPU table: every config compiled for every generation
    tfrecord          TFRecords read in place against converted, local against a bucket
    checkpoint_store  checkpoint save and restore, a local folder against a bucket
    mllog_pace        host dispatch pace against device pace in MLPerf result logs
    maskrcnn_split_eval  a Mask R-CNN checkpoint's mAP on the eval and the training split
    anchor_coverage   how well Mask R-CNN's anchors cover a config's ground-truth boxes
    input             each mlperf_v07 config's per-host input rate against pod pace
    packing_stats     padding of a BERT config's training rows, unpacked and packed

Flags that several tools take are defined once, in `launch.bench.common`. Nothing in a
run imports this package.
"""
