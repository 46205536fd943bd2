"""A job that prints one line and then nothing while it waits forever, like a worker stuck
in a collective: the benchmark's stall timeout must end it."""
import time

print("silent job started", flush=True)
while True:
    time.sleep(1)
