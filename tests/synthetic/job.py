"""A synthetic training job for sweep tests, written against the PAI contract only.

Hyperparameters (PAI_HPS): x (the objective is x**2), duration (seconds, spread over
`steps` per-step lines `loss=...`), fail ("true" -> exit 3), nan ("true" -> prints nan),
silent ("true" -> never prints the objective), model ("true" -> writes a model file to
the model channel), tensorboard ("true" -> prints nothing: writes each step's loss as scalar
`loss` and accuracy as `accuracy` to $PAI_OUTPUT_TENSORBOARD/train, and the score as `score`
to the channel itself, with tensorboardX), mlflow ("true" -> prints nothing: logs loss and
accuracy per step and the score with mlflow.log_metric, in a run of its own). Every
execution appends its hyperparameters (PAI_HPS, one line) to the file named by $LEDGER, so
tests can count executions and tell whose they were (every job's working directory is
/ml/usercode, as on PAI). With $GATE
set, a job ends only once the file it names exists (a test holds jobs running that way). With
$GATES set (a directory), each job is held on its own: it makes ID.held there (holding its
pid) and ends only once the test makes ID.open; with hold_every=K, it is also held so after
every K-th loss line but the last (a new ID each time), its lines printed in stages.
"""

import json
import os
import sys
import time
import uuid

hps = json.loads(os.environ["PAI_HPS"])
x = float(hps.get("x", 0))
duration = float(hps.get("duration", 0.5))
steps = int(hps.get("steps", 5))
hold_every = int(hps.get("hold_every", 0))
gates = os.environ.get("GATES")


def hold() -> None:
    """Wait at a gate of its own in $GATES until the test opens it."""
    if not gates:
        return
    held = os.path.join(gates, uuid.uuid4().hex)
    with open(held + ".tmp", "w") as stream:  # its pid, whole once it is held
        stream.write(str(os.getpid()))
    os.replace(held + ".tmp", held + ".held")
    while not os.path.exists(held + ".open"):
        time.sleep(0.05)


ledger = os.environ.get("LEDGER")
if ledger:
    with open(ledger, "a") as stream:
        stream.write(os.environ["PAI_HPS"] + "\n")

scalars = None
if hps.get("tensorboard") == "true":
    from tensorboardX import SummaryWriter

    channel = os.environ["PAI_OUTPUT_TENSORBOARD"]
    scalars = SummaryWriter(os.path.join(channel, "train"), flush_secs=1)
own_run = None
if hps.get("mlflow") == "true":
    import mlflow

    own_run = mlflow.start_run()

for step in range(steps):
    time.sleep(duration / steps)
    loss = x * x + 1.0 / (step + 1)
    if own_run is not None:
        mlflow.log_metrics({"loss": loss, "accuracy": 1.0 - loss / 10}, step=step)
    elif scalars is None:
        print(f"loss={loss:.6f}", flush=True)
    else:
        scalars.add_scalar("loss", loss, step)
        scalars.add_scalar("accuracy", 1.0 - loss / 10, step)
        scalars.flush()
    if hold_every and (step + 1) % hold_every == 0 and step + 1 < steps:
        hold()

gate = os.environ.get("GATE")
while gate and not os.path.exists(gate):
    time.sleep(0.05)
hold()

if hps.get("fail") == "true":
    print("something went wrong", file=sys.stderr)
    sys.exit(3)
if hps.get("model") == "true":
    with open(os.path.join(os.environ["PAI_OUTPUT_MODEL"], "model.txt"), "w") as stream:
        stream.write(f"x={x}\n")
if own_run is not None:
    if hps.get("silent") != "true":
        mlflow.log_metric("score", float("nan") if hps.get("nan") == "true" else x * x)
    mlflow.end_run()
elif scalars is not None:
    scalars.close()
    if hps.get("silent") != "true":
        with SummaryWriter(os.environ["PAI_OUTPUT_TENSORBOARD"]) as final:
            final.add_scalar("score", float("nan") if hps.get("nan") == "true" else x * x, 0)
elif hps.get("silent") != "true":
    print(f"score={'nan' if hps.get('nan') == 'true' else repr(x * x)}", flush=True)
