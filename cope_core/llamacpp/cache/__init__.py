"""llama.cpp's MoE expert cache: the replay port (``moe_cache``, kernels in ``_cache_kernels``, the
plan in ``_cache_plan``), the size cliff (``cache_cliff``), the pricing and search
(``cache_search``), the class-LRU's inferred readings (``cache_readings``) and the server's own
counters in its log (``server_log``). Imports only the placement."""
