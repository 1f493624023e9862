"""One iteration, below everything that runs one: its phases' order and the update's placement
(`iteration_controller`), its modelled seconds (`iteration_time`) and seed exploration's planning side
(`exploration`). `spotlight.train` (the live run), `spotlight.runtime` (who executes the phases) and
`spotlight.sim` (the simulator) import it; it imports none of them (`tests/test_imports.py`)."""
