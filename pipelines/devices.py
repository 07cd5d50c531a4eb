"""Where the extract actors run (``hpd extract --device``, ``build.ResourceConfig.device``).

Its own module so that the command line can offer the choices without importing Ray (``hpd bench``
runs on machines without it): ``auto``, the GPUs the cluster has when the job starts, else its
CPUs; ``gpu``, one GPU per actor, asked of an autoscaling cluster and waited for
(``build.await_gpus``); ``cpu``, on CPUs whatever GPUs there are.
"""

DEVICES = ("auto", "gpu", "cpu")
DEFAULT_DEVICE = "auto"
