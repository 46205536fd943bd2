"""The trained parameter arrays of the models an accelerator-paced worker stands in for
(odsgd/bench/paced.py): every array that gluon.Trainer hands the store each step, in the
Trainer's order (it sorts parameters by name), as GluonCV 0.10.5's `get_model(name)` builds
them (1000 classes; cifar_resnet20_v1: 10). BatchNorm's running mean and variance are not
trained (grad_req 'null') and never travel in a step, so they are not here.

tests/test_bench_plan.py holds this table to the real models; a table in code keeps the paced
worker from building a GluonCV model in each of its processes.
"""

#: model -> shapes of its trained arrays, in gluon.Trainer's order
SHAPES = {
    "resnet50_v1": (
        (64,), (64,), (64, 3, 7, 7), (1000,), (1000, 2048), (64,), (64,), (64,), (64,), (256,),
        (256,), (256,), (256,), (64,), (64,), (64,), (64,), (256,), (256,), (64,), (64,),
        (64,), (64,), (256,), (256,), (64,), (64, 64, 1, 1), (64, 64, 3, 3), (256,),
        (256, 64, 1, 1), (256, 64, 1, 1), (64,), (64, 256, 1, 1), (64, 64, 3, 3), (256,),
        (256, 64, 1, 1), (64,), (64, 256, 1, 1), (64, 64, 3, 3), (256,), (256, 64, 1, 1),
        (128,), (128,), (128,), (128,), (128,), (128,), (512,), (512,), (128,), (128,), (512,),
        (512,), (512,), (512,), (128,), (128,), (128,), (128,), (512,), (512,), (128,), (128,),
        (128,), (128,), (512,), (512,), (128,), (128, 256, 1, 1), (128,), (128, 512, 1, 1),
        (128, 128, 3, 3), (512,), (512, 128, 1, 1), (128, 128, 3, 3), (512,), (512, 128, 1, 1),
        (512, 256, 1, 1), (128,), (128, 512, 1, 1), (128, 128, 3, 3), (512,), (512, 128, 1, 1),
        (128,), (128, 512, 1, 1), (128, 128, 3, 3), (512,), (512, 128, 1, 1), (256,), (256,),
        (256,), (256,), (256,), (256,), (1024,), (1024,), (256,), (256,), (256,), (256,),
        (1024,), (1024,), (256,), (256,), (256,), (256,), (1024,), (1024,), (256,), (256,),
        (1024,), (1024,), (1024,), (1024,), (256,), (256,), (256,), (256,), (1024,), (1024,),
        (256,), (256,), (256,), (256,), (1024,), (1024,), (256,), (256, 512, 1, 1), (256,),
        (256, 1024, 1, 1), (256, 256, 3, 3), (1024,), (1024, 256, 1, 1), (256,),
        (256, 1024, 1, 1), (256, 256, 3, 3), (1024,), (1024, 256, 1, 1), (256,),
        (256, 1024, 1, 1), (256, 256, 3, 3), (1024,), (1024, 256, 1, 1), (256, 256, 3, 3),
        (1024,), (1024, 256, 1, 1), (1024, 512, 1, 1), (256,), (256, 1024, 1, 1),
        (256, 256, 3, 3), (1024,), (1024, 256, 1, 1), (256,), (256, 1024, 1, 1),
        (256, 256, 3, 3), (1024,), (1024, 256, 1, 1), (512,), (512,), (512,), (512,), (2048,),
        (2048,), (2048,), (2048,), (512,), (512,), (512,), (512,), (2048,), (2048,), (512,),
        (512,), (512,), (512,), (2048,), (2048,), (512,), (512, 1024, 1, 1), (512, 512, 3, 3),
        (2048,), (2048, 512, 1, 1), (2048, 1024, 1, 1), (512,), (512, 2048, 1, 1),
        (512, 512, 3, 3), (2048,), (2048, 512, 1, 1), (512,), (512, 2048, 1, 1),
        (512, 512, 3, 3), (2048,), (2048, 512, 1, 1),
    ),
    "resnet18_v2": (
        (64,), (64,), (512,), (512,), (64, 3, 7, 7), (1000,), (1000, 512), (64,), (64,), (64,),
        (64,), (64,), (64,), (64,), (64,), (64, 64, 3, 3), (64, 64, 3, 3), (64, 64, 3, 3),
        (64, 64, 3, 3), (64,), (64,), (128,), (128,), (128,), (128,), (128,), (128,),
        (128, 64, 3, 3), (128, 128, 3, 3), (128, 64, 1, 1), (128, 128, 3, 3), (128, 128, 3, 3),
        (128,), (128,), (256,), (256,), (256,), (256,), (256,), (256,), (256, 128, 3, 3),
        (256, 256, 3, 3), (256, 128, 1, 1), (256, 256, 3, 3), (256, 256, 3, 3), (256,), (256,),
        (512,), (512,), (512,), (512,), (512,), (512,), (512, 256, 3, 3), (512, 512, 3, 3),
        (512, 256, 1, 1), (512, 512, 3, 3), (512, 512, 3, 3),
    ),
    "cifar_resnet20_v1": (
        (16,), (16,), (16, 3, 3, 3), (10,), (10, 64), (16,), (16,), (16,), (16,), (16,), (16,),
        (16,), (16,), (16,), (16,), (16,), (16,), (16, 16, 3, 3), (16, 16, 3, 3),
        (16, 16, 3, 3), (16, 16, 3, 3), (16, 16, 3, 3), (16, 16, 3, 3), (32,), (32,), (32,),
        (32,), (32,), (32,), (32,), (32,), (32,), (32,), (32,), (32,), (32,), (32,),
        (32, 16, 3, 3), (32, 32, 3, 3), (32, 16, 1, 1), (32, 32, 3, 3), (32, 32, 3, 3),
        (32, 32, 3, 3), (32, 32, 3, 3), (64,), (64,), (64,), (64,), (64,), (64,), (64,), (64,),
        (64,), (64,), (64,), (64,), (64,), (64,), (64, 32, 3, 3), (64, 64, 3, 3),
        (64, 32, 1, 1), (64, 64, 3, 3), (64, 64, 3, 3), (64, 64, 3, 3), (64, 64, 3, 3),
    ),
}

#: what these shapes are for, in the benchmark's and the planner's messages
MODEL_NAMES = ", ".join(sorted(SHAPES))


def _elements(shape):
    count = 1
    for dim in shape:
        count *= dim
    return count


def model_shapes(model):
    """The shapes of `model`'s trained arrays; a ValueError naming the known models."""
    if model not in SHAPES:
        raise ValueError("no parameter shapes for model %r: accelerator-paced workers and "
                         "the planner know %s (add the model to odsgd/bench/model_shapes.py, "
                         "checked against GluonCV by tests/test_bench_plan.py)"
                         % (model, MODEL_NAMES))
    return SHAPES[model]


def scaled_sizes(model, byte_scale=1):
    """Elements of each trained array of `model` with the byte scale applied: each count
    divided by `byte_scale` (integer division), at least 1, so that the number of arrays, and
    with it the number of messages a step sends, stays that of the model."""
    if int(byte_scale) != byte_scale or byte_scale < 1:
        raise ValueError("the byte scale must be an integer >= 1 (1: the model's own sizes), "
                         "got %r" % (byte_scale,))
    return [max(1, _elements(shape) // int(byte_scale)) for shape in model_shapes(model)]


def scaled_shapes(model, byte_scale=1):
    """The arrays a paced worker trains: the model's own shapes at byte scale 1, else flat
    arrays of scaled_sizes (the store sees only element counts)."""
    if byte_scale == 1:
        return [tuple(shape) for shape in model_shapes(model)]
    return [(size,) for size in scaled_sizes(model, byte_scale)]
