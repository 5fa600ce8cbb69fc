# Cells the strict policy must refuse: each reaches a forbidden name (or one it cannot read).
# One cell per block; blocks are separated by a line holding only `# ---`. Add to it freely.
getattr(__builtins__, '\x65val')('1+1')
# ---
getattr(__builtins__, '\145val')('1+1')
# ---
getattr(__builtins__, '\u0065val')('1+1')
# ---
getattr(__builtins__, '\U00000065val')('1+1')
# ---
getattr(__builtins__, '\N{LATIN SMALL LETTER E}val')('1+1')
# ---
getattr(__builtins__, '\N{latin small letter e}val')('1+1')
# ---
import builtins as b
getattr(b, 'ev' 'al')('1+1')
# ---
f = getattr(print, '__self__')
getattr(f, ('e' + 'v') + 'al')('1+1')
# ---
m = print.__self__
getattr(m, 'e\
val')('1+1')
# ---
m = print.__self__
getattr(m, 'eval'[0:4])('1+1')
# ---
m = print.__self__
getattr(m, ''.join(['e', 'v', 'a', 'l']))('1+1')
# ---
m = print.__self__
getattr(m, f'{"ev"}al')('1+1')
# ---
m = print.__self__
getattr(m, chr(101) + 'val')('1+1')
# ---
m = print.__self__
getattr(m, '{}val'.format('e'))('1+1')
# ---
m = print.__self__
name = 'lave'[::-1]
getattr(m, name)('1+1')
# ---
m = print.__self__
g = getattr
g(m, 'eval')('1+1')
# ---
import functools
m = print.__self__
functools.reduce(getattr, ['eval'], m)('1+1')
# ---
from operator import attrgetter
m = print.__self__
attrgetter('ev' + 'al')(m)('1+1')
# ---
from operator import attrgetter
m = print.__self__
attrgetter('\x65val')(m)('1+1')
# ---
from operator import attrgetter as get
m = print.__self__
get('eval')(m)('1+1')
# ---
import operator
m = print.__self__
operator.methodcaller('\x65val', '1+1')(m)
# ---
import inspect
m = print.__self__
inspect.getattr_static(m, 'e' 'val')('1+1')
# ---
__builtins__['\x65val']('1+1')
# ---
__builtins__.eval('1+1')
# ---
b = __builtins__
b.eval('1+1')
# ---
globals()['__builtins__'].eval('1+1')
# ---
m = print.__self__
m.__dict__['\x65val']('1+1')
# ---
m = print.__self__
key = 'eval'
m.__dict__[key]('1+1')
# ---
m = print.__self__
m.__dict__.get('eval')('1+1')
# ---
m = print.__self__
setattr(m, 'ev' 'al', None)
# ---
m = print.__self__
hasattr(m, b'ev\x61l'.decode())
# ---
__import__('\x6fs').system('true')
# ---
name = 'o' + chr(115)
__import__(name)
# ---
import importlib
importlib.import_module('o' 's')
# ---
template = '{0.__globals__}'
template.format(lambda: 0)
# ---
'{0.\x5f_globals__}'.format(lambda: 0)
# ---
'{0.__class__.__base__.__subclasses__}'.format(0)
# ---
(lambda: 0).__globals__
# ---
e = r'\x65val'
getattr(print.__self__, e.encode().decode('unicode_escape'))('1+1')
# ---
ｅｖａｌ('1+1')
# ---
getattr(print.__self__, 'ｅval')
# ---
x = [[[[[[[[[[[[[[[[[[[[getattr(print.__self__, 'e' 'val')]]]]]]]]]]]]]]]]]]]
