"""The answer, made once: which build has which flag, cache and default (``builds``), the settings
llama.cpp runs with (``settings``), the prompt model (``prompt``), the request as the objective
(``request``), the one rule (``rule``), the default as facts (``baseline``), the record a policy
keeps (``cache_record``) and its notes (``cache_notes``), and the answer itself (``answer``).
Imports the placement and the cache."""
