"""An accelerator's step time, from published figures: what an accelerator-paced worker
(odsgd/bench/paced.py) waits in place of its forward and backward, and the planner's t_comp.

The one table of figures is ACCELERATORS (ResNet-50 training throughput of one GPU, with its
source) with MULTIPLY_ADDS (the models' work per image); docs/benchmarks.md, "Accelerator-paced
workers and the planner", lists both with their sources.
"""
import collections

#: NVIDIA's MXNet ResNet-50 v1.5 training results: NVIDIA/DeepLearningExamples,
#: MxNet/Classification/RN50v1.5/README.md, "Training performance results" (mxnet-20.12-py3
#: NGC container, `benchmark.py --mode train`, total images/s with data loading, 1 GPU row)
DLE_RN50 = "NVIDIA DeepLearningExamples MxNet/Classification/RN50v1.5 README, 1-GPU row"

Accelerator = collections.namedtuple("Accelerator", [
    "description",            # what ran, for messages
    "resnet50_images_per_sec",  # training throughput of one GPU, ResNet-50 v1.5
    "measured_batch",         # the batch size per GPU of that figure
    "source",                 # where the figure is published
    "memory_gb_per_sec",      # the GPU's memory bandwidth (GB/s, 1e9 bytes), for the local update
    "memory_source"])

ACCELERATORS = {
    "v100": Accelerator("V100 16GB (DGX-1), FP32", 384.0, 96, DLE_RN50 + " (DGX-1 8x V100 16GB)",
                        900.0, "NVIDIA V100 datasheet (HBM2, 900 GB/s)"),
    "v100-amp": Accelerator("V100 16GB (DGX-1), mixed precision", 1376.0, 192,
                            DLE_RN50 + " (DGX-1 8x V100 16GB)", 900.0,
                            "NVIDIA V100 datasheet (HBM2, 900 GB/s)"),
    "a100": Accelerator("A100 80GB (DGX A100), TF32", 1022.0, 256,
                        DLE_RN50 + " (DGX A100 8x A100 80GB)", 2039.0,
                        "NVIDIA A100 80GB SXM datasheet (HBM2e, 2039 GB/s; quoted from "
                        "secondary pages, not read at the source)"),
    "a100-amp": Accelerator("A100 80GB (DGX A100), mixed precision", 2180.0, 256,
                            DLE_RN50 + " (DGX A100 8x A100 80GB)", 2039.0,
                            "NVIDIA A100 80GB SXM datasheet (HBM2e, 2039 GB/s; quoted from "
                            "secondary pages, not read at the source)"),
}

#: multiply-adds of one image's forward pass (convolutions and dense layers) of each GluonCV
#: model at its input size (224x224; cifar_resnet20_v1 32x32), counted from the real models'
#: shapes (tests/test_bench_plan.py recounts them): 3.86 G and 1.81 G agree with the 3.8 G
#: and 1.8 G of He et al. 2016, Table 1, for ResNet-50 and ResNet-18
MULTIPLY_ADDS = {"resnet50_v1": 3857973248, "resnet18_v2": 1814073344,
                 "cifar_resnet20_v1": 40813184}

#: the model the published figures are of; the others are scaled from it by MULTIPLY_ADDS
MEASURED_MODEL = "resnet50_v1"

#: bytes the fused local update moves per element, by local optimizer (docs/gpu.md,
#: `check-gpu`: sgd 24, predict 20, nag_predict 28, 8 more in adaptive mode)
LOCAL_UPDATE_BYTES = {"sgd": 24, "predict": 20, "nag_predict": 28}

DEVICE_NAMES = ", ".join(sorted(ACCELERATORS))


def accelerator(device):
    """The Accelerator of `device`; a ValueError naming the known ones."""
    if device not in ACCELERATORS:
        raise ValueError("unknown device profile %r: choose one of %s, or give the step "
                         "time itself (--compute-ms / --step-ms)" % (device, DEVICE_NAMES))
    return ACCELERATORS[device]


def sample_seconds(model, device):
    """Seconds of one image's forward and backward on `device`: the published ResNet-50
    figure's 1 / throughput, times the model's multiply-adds over ResNet-50's (an estimate
    for every model but ResNet-50: small models use a GPU less fully than the ratio says)."""
    if model not in MULTIPLY_ADDS:
        raise ValueError("no step time for model %r on an accelerator: the profiles know %s; "
                         "give the step time itself (--compute-ms / --step-ms)"
                         % (model, ", ".join(sorted(MULTIPLY_ADDS))))
    ratio = MULTIPLY_ADDS[model] / float(MULTIPLY_ADDS[MEASURED_MODEL])
    return ratio / accelerator(device).resnet50_images_per_sec


def step_seconds(model, device, batch_size):
    """One worker's forward and backward of `batch_size` images: linear in the batch
    (sample_seconds x batch_size), as the published figure is a throughput."""
    if batch_size < 1:
        raise ValueError("the batch size must be >= 1, got %r" % (batch_size,))
    return sample_seconds(model, device) * batch_size


def is_estimate(model):
    """Whether the step time of `model` is scaled from ResNet-50's by multiply-adds."""
    return model != MEASURED_MODEL


def local_update_seconds(elements, device, local_optimizer="predict"):
    """The fused local update's time on `device`'s GPU: the bytes it must move
    (LOCAL_UPDATE_BYTES per element) over the memory bandwidth. What the byte scale leaves out
    of a paced run, whose local update runs on this machine's CPU over the scaled arrays."""
    return elements * LOCAL_UPDATE_BYTES[local_optimizer] / (
        accelerator(device).memory_gb_per_sec * 1e9)
