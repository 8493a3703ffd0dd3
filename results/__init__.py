"""Results: the labelled HDF5 store (:mod:`.store`) and the run's layout (:mod:`.layout`)."""
