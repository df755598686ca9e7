"""Tools around the dispatcher: the daily-operations benchmark, the MLflow load test and a made-up full-size
sweep folder for timing status."""
