"""The ray-tpu policy pack: rules that block TPU slices whose host and chip counts do not match.

``policies.rules`` holds pure functions over the properties Pulumi hands a policy (camelCase keys,
numbers as floats, unknown values during preview); ``policies.pack`` lists them as data;
``policies/__main__.py`` turns that list into a ``pulumi_policy.PolicyPack``. ``raytpu preview``
and ``raytpu check`` run the same list offline.
"""
