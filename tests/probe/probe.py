"""A training-job probe written against the PAI job contract only, not against paiexp.

It reads its inputs exactly the documented PAI ways and writes what it saw to
$PAI_OUTPUT_MODEL/seen.json: the hyperparameters file under $PAI_CONFIG_DIR, PAI_HPS,
every PAI_HPS_<NAME>, argparse over $PAI_USER_ARGS, PAI_INPUT_<CHANNEL> and the /ml layout
(every file and directory under the root of PAI_WORKING_DIR).
"""

import argparse
import json
import os
import shlex
import sys

config_dir = os.environ["PAI_CONFIG_DIR"]
with open(os.path.join(config_dir, "hyperparameters.json")) as stream:
    from_file = json.load(stream)

parser = argparse.ArgumentParser()
for name in from_file:
    parser.add_argument("--" + name)
parsed = vars(parser.parse_args(shlex.split(os.environ["PAI_USER_ARGS"])))

inputs = {}
for key, value in os.environ.items():
    if key.startswith("PAI_INPUT_"):
        if os.path.isdir(value):
            inputs[key] = {"kind": "dir", "files": sorted(os.listdir(value))}
        else:
            with open(value) as stream:
                inputs[key] = {"kind": "file", "content": stream.read()}

# Every directory (with a trailing /) and file of the /ml tree, relative to its root.
ml_root = os.path.dirname(os.environ["PAI_WORKING_DIR"])
ml_tree = []
for directory, _, files in os.walk(ml_root, followlinks=True):
    relative = os.path.relpath(directory, ml_root)
    if relative != ".":
        ml_tree.append(relative + "/")
    ml_tree += [os.path.join(relative, name).removeprefix("./") for name in files]

seen = {
    "ml_tree": sorted(ml_tree),
    "file": from_file,
    "pai_hps": json.loads(os.environ["PAI_HPS"]),
    "hps_env": {k: v for k, v in os.environ.items() if k.startswith("PAI_HPS_")},
    "user_args": parsed,
    "argv": sys.argv[1:],
    "inputs": inputs,
    "outputs": {k: v for k, v in os.environ.items() if k.startswith("PAI_OUTPUT_")},
    "cwd": os.getcwd(),
    "code_is_usercode": os.path.samefile(
        os.path.join(ml_root, "code"), os.environ["PAI_WORKING_DIR"]
    ),
    "working_dir": os.environ["PAI_WORKING_DIR"],
    "config_dir": config_dir,
    "usercode": sorted(os.listdir(os.environ["PAI_WORKING_DIR"])),
    "custom_env": os.environ.get("PROBE_CUSTOM"),
}
model_dir = os.environ["PAI_OUTPUT_MODEL"]
with open(os.path.join(model_dir, "seen.json"), "w") as stream:
    json.dump(seen, stream, indent=2)
print("probe-ok=1")
