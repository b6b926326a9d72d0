"""Golden runs: fixed-seed tiny pretraining runs whose logged values and final weights are stored
here and must be reproduced exactly (see ``test_golden_runs``)."""
