"""Checking gradients: ``gradc check``'s finite-difference checks
(:mod:`gradc.audit.gradcheck`), the audit of custom rules against the true derivative
(:mod:`gradc.audit.custom_rules`, on the symbolic forms of :mod:`gradc.audit.canonical`)
and the report they make (:mod:`gradc.audit.report`)."""
