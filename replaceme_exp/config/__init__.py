"""Configuration: the typed schema of a job (:mod:`.schema`), its check key by key into typed
dataclasses (:mod:`.validate`) and its place in Hydra's ConfigStore (:mod:`.store`)."""
