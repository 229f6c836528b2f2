"""llama-bench: its result files (``bench_file``), scored against predictions (``bench_eval``), run
(``bench_run``), raced (``bench_verify``) and recorded (``bench_record``). Imports the
placement, the cache and the answer."""
