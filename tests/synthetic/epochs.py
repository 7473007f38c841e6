"""An epoch-wise job that checkpoints and resumes, for the preemption tests (PAI contract only).

Hyperparameters: x (the objective is x**2), epochs, hold. ``checkpoint`` in
$PAI_OUTPUT_CHECKPOINTS holds the last epoch done; a job that finds it resumes after it. Each
epoch started is a line of ``epochs`` in the ``ledger`` output channel, so a test counts the
epochs every job ran. A job that did not resume, after checkpointing ``hold`` epochs, starts
the next one, writes ``held`` there (its host name: a container's id) and waits to be killed:
the test preempts it when it sees that file.
"""

import json
import os
import socket
import time

hps = json.loads(os.environ["PAI_HPS"])
x = float(hps["x"])
epochs = int(hps["epochs"])
hold = int(hps.get("hold", 0))
checkpoint = os.path.join(os.environ["PAI_OUTPUT_CHECKPOINTS"], "checkpoint")
ledger = os.environ["PAI_OUTPUT_LEDGER"]

resumed = os.path.exists(checkpoint)
done = 0
if resumed:
    with open(checkpoint) as stream:
        done = int(stream.read())
for epoch in range(done + 1, epochs + 1):
    with open(os.path.join(ledger, "epochs"), "a") as stream:
        stream.write(f"{epoch}\n")
    if hold and not resumed and epoch == hold + 1:
        with open(os.path.join(ledger, "held.tmp"), "w") as stream:
            stream.write(socket.gethostname())
        os.replace(os.path.join(ledger, "held.tmp"), os.path.join(ledger, "held"))
        while True:  # mid-epoch: this epoch is lost when the job is
            time.sleep(1)
    print(f"loss={x * x + 1.0 / epoch:.6f}", flush=True)
    with open(checkpoint + ".tmp", "w") as stream:
        stream.write(str(epoch))
    os.replace(checkpoint + ".tmp", checkpoint)
print(f"score={x * x!r}", flush=True)
