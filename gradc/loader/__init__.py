"""Loading .grad files as modules: :func:`gradc.load` (:mod:`gradc.loader.load`), the
on-disk cache of compiled modules (:mod:`gradc.loader.disk_cache`) and the import hook
(:mod:`gradc.loader.import_hook`).  Generated modules never import any of it; the
run time they carry is copied into them (:mod:`gradc.codegen.runtime_src`)."""
