"""Session fixtures shared by the test suite: the local SLURM cluster, an MLflow server and headless Chromium."""

pytest_plugins = ["tests.plugins.slurm_cluster", "tests.plugins.mlflow_server", "tests.plugins.browser",
                  "tests.plugins.demo"]
