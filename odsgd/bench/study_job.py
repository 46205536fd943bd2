"""The main of a study's training job (digits_job, image_job): parse, train, and rank 0 writes
the result as JSON to --json."""
import json
import logging


def run_and_write(parse_args, train, argv=None):
    """`train(args)` returns (result, rank); rank 0 writes `result` to `args.json`."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result, rank = train(args)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
